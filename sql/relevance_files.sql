-- relevance: every file every snapshotted PR changed, with the PR's merge time
-- (microseconds): the changed paths of the PRs being ranked, and the history that co-change
-- counts come from, with each PR's title and body (earlier PRs that read like the one being
-- ranked vote for the files they changed). In a fixed order, like every input of the ranker.
SELECT f.repo_name,
       f.pr_number,
       f.path,
       f.old_path,
       f.status,
       CAST(coalesce(p.merged_at, p.last_event_at) AS BIGINT) AS merged_at,
       concat(coalesce(p.title, ''), chr(10), coalesce(p.body, '')) AS text
FROM pr_files f
JOIN pull_requests p ON p.repo_name = f.repo_name AND p.number = f.pr_number
ORDER BY f.repo_name, f.pr_number, f.path
