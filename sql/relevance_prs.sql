-- relevance: the kept, snapshotted PRs to rank, with the text the ranker matches against —
-- the PR's title and body and the titles and bodies of the issues it resolves — and the time
-- it was merged (microseconds; its history is the PRs merged before it). Every order is fixed:
-- the ranker's input, and so its scores, must be the same on every run.
WITH issue_text AS (
    SELECT l.repo_name, l.pr_number,
           string_agg(concat(coalesce(i.title, ''), chr(10), coalesce(i.body, '')), chr(10)
                      ORDER BY l.issue_repo_name, l.issue_number) AS text
    FROM pr_issue_links l
    JOIN issues i ON i.repo_name = l.issue_repo_name AND i.number = l.issue_number
    GROUP BY l.repo_name, l.pr_number
)
SELECT q.repo_name,
       q.pr_number,
       s.merge_base,
       concat(coalesce(p.title, ''), chr(10), coalesce(p.body, ''), chr(10), coalesce(it.text, '')) AS text,
       CAST(coalesce(p.merged_at, p.last_event_at) AS BIGINT) AS merged_at
FROM pr_quality q
JOIN pr_snapshots s ON s.repo_name = q.repo_name AND s.pr_number = q.pr_number AND s.status = 'ok'
JOIN pull_requests p ON p.repo_name = q.repo_name AND p.number = q.pr_number
LEFT JOIN issue_text it ON it.repo_name = q.repo_name AND it.pr_number = q.pr_number
WHERE q.keep
ORDER BY q.repo_name, q.pr_number
