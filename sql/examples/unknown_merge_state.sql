-- Closed pull requests whose merge state the archive does not tell (trimmed payloads).
SELECT metadata_source, merge_source, count(*) AS prs
FROM pull_requests
WHERE merged IS NULL
GROUP BY metadata_source, merge_source
ORDER BY prs DESC;
