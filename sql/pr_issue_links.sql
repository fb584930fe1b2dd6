-- pr_issue_links: the issues each pull request says it resolves.
--
-- Input: `pr_timeline_new` selects the PRs to recompute, with those snapshotted from git since
-- the job's last run; their texts are the title and body in `pull_requests`, the messages of
-- commits pushed to their head branch in `pr_timeline` (absent after the 2025-10-07 trim), and
-- the messages of their commits read from git in `pr_commits`.
-- resolving_refs() (a Rust UDF) finds closing keywords and references in every form; one row
-- per (PR, issue), with the keyword and the first text it came from (title, body, commit).
-- The touched PRs are every join's left (build) side: the tables they pick rows from grow
-- with the lake, and only the touched PRs' rows pass the filter the join pushes into a scan.
WITH touched AS (
    SELECT DISTINCT repo_name, pr_number FROM pr_timeline_new
    UNION
    SELECT repo_name, pr_number FROM pr_snapshots
    WHERE status = 'ok' AND snapshotted_at > (SELECT last_run_at FROM job_last_run)
),
texts AS (
    SELECT p.repo_name, p.number AS pr_number, 1 AS source_rank, 'title' AS source, p.title AS text
    FROM touched k JOIN pull_requests p ON p.repo_name = k.repo_name AND p.number = k.pr_number
    UNION ALL
    SELECT p.repo_name, p.number, 2, 'body', p.body
    FROM touched k JOIN pull_requests p ON p.repo_name = k.repo_name AND p.number = k.pr_number
    UNION ALL
    SELECT repo_name, pr_number, 3, 'commit_message', message
    FROM (
        SELECT t.repo_name, t.pr_number, unnest(t.push_commit_messages) AS message
        FROM touched k JOIN pr_timeline t ON t.repo_name = k.repo_name AND t.pr_number = k.pr_number
        WHERE t.kind = 'push' AND t.push_commit_messages IS NOT NULL
    ) m
    UNION ALL
    SELECT c.repo_name, c.pr_number, 3, 'commit_message', c.message
    FROM touched k JOIN pr_commits c ON c.repo_name = k.repo_name AND c.pr_number = k.pr_number
),
refs AS (
    SELECT repo_name, pr_number, source_rank, source, unnest(resolving_refs(text, repo_name, pr_number)) AS r
    FROM texts
    WHERE text IS NOT NULL
),
flat AS (
    SELECT repo_name, pr_number, source_rank, source, r['repo'] AS issue_repo_name, r['number'] AS issue_number, r['keyword'] AS keyword
    FROM refs
)
SELECT
    repo_name,
    pr_number,
    issue_repo_name,
    issue_number,
    first_value(keyword ORDER BY source_rank) AS keyword,
    first_value(source ORDER BY source_rank) AS source,
    count(*) AS mentions
FROM flat
GROUP BY repo_name, pr_number, issue_repo_name, issue_number
