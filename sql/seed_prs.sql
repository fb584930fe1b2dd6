-- seed: every kept, snapshotted PR with its title, body, merge time (as text, the form it is
-- recorded in) and SHAs.
SELECT q.repo_name,
       q.pr_number,
       coalesce(p.title, '') AS title,
       coalesce(p.body, '') AS body,
       CAST(p.merged_at AS VARCHAR) AS merged_at,
       s.base_sha,
       s.head_sha,
       s.merge_base
FROM pr_quality q
JOIN pull_requests p ON p.repo_name = q.repo_name AND p.number = q.pr_number
JOIN pr_snapshots s ON s.repo_name = q.repo_name AND s.pr_number = q.pr_number AND s.status = 'ok'
WHERE q.keep
