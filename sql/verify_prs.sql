-- verify: every kept PR with an ok snapshot, with the merge base and head its runs start from
-- and its merge time (the day its environment is resolved as of), in RFC 3339.
SELECT q.repo_name,
       q.pr_number,
       s.merge_base,
       s.head_sha,
       to_char(p.merged_at, '%Y-%m-%dT%H:%M:%SZ') AS merged_at
FROM pr_quality q
JOIN pull_requests p ON p.repo_name = q.repo_name AND p.number = q.pr_number
JOIN pr_snapshots s ON s.repo_name = q.repo_name AND s.pr_number = q.pr_number AND s.status = 'ok'
WHERE q.keep AND p.merged_at IS NOT NULL
ORDER BY q.repo_name, q.pr_number
