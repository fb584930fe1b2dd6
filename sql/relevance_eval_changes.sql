-- eval-relevance on a lake: the merged, snapshotted PRs of one repository (the one-row table
-- `eval_repo`) in merge order, one row per changed file, with the PR's text.
SELECT s.merge_base,
       concat(coalesce(p.title, ''), chr(10), coalesce(p.body, '')) AS text,
       f.path,
       f.old_path,
       f.status
FROM pr_snapshots s
JOIN pull_requests p ON p.repo_name = s.repo_name AND p.number = s.pr_number
JOIN pr_files f ON f.repo_name = s.repo_name AND f.pr_number = s.pr_number
WHERE s.status = 'ok' AND s.repo_name = (SELECT repo_name FROM eval_repo)
ORDER BY p.merged_at, s.pr_number, f.path
