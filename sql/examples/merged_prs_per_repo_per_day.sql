-- Merged pull requests per repository and day.
SELECT repo_name, CAST(merged_at AS DATE) AS day, count(*) AS merged_prs
FROM pull_requests
WHERE merged
GROUP BY repo_name, CAST(merged_at AS DATE)
ORDER BY day, merged_prs DESC, repo_name;
