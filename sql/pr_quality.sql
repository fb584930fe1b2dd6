-- pr_quality: every pull request with `keep` and the code of every reason it is not kept.
--
-- Inputs: pull_requests, pr_files, pr_issue_links, issues, pr_snapshots, and the thresholds of
-- the curation config as the one-row table `config_filters` (min_files, max_files,
-- max_changed_lines, min_issue_chars, require_linked_issue, pr_text_problems) and
-- `config_decontaminate(repo)`.
-- The predicates is_bot_account, botlike_text, is_noise_path and is_version_only_patch are
-- Rust UDFs configured by the same file. A PR is kept when it has no reason at all.
-- problem_source: 'issue' when a linked issue has text in `issues`, else 'pr_text' (the seed's
-- problem statement is then the PR's title and body, as for PRs found only in git).
-- The per-PR facts of the smaller tables are joined to the PRs with those facts as the
-- joins' build sides.
WITH files AS (
    SELECT
        repo_name,
        pr_number,
        count(*) AS files,
        sum(additions + deletions) AS changed_lines,
        sum(CASE WHEN language IS NOT NULL THEN 1 ELSE 0 END) AS code_files,
        sum(CASE WHEN is_noise_path(path) OR is_version_only_patch(patch) THEN 1 ELSE 0 END) AS noise_files
    FROM pr_files
    GROUP BY repo_name, pr_number
),
issue_text AS (
    SELECT
        l.repo_name,
        l.pr_number,
        count(*) AS linked_issues,
        sum(CASE WHEN i.number IS NOT NULL THEN 1 ELSE 0 END) AS known_issues,
        sum(length(coalesce(i.title, '')) + length(coalesce(i.body, ''))) AS issue_chars
    FROM pr_issue_links l
    LEFT JOIN issues i
        ON i.repo_name = l.issue_repo_name AND i.number = l.issue_number AND NOT i.is_pull_request
    GROUP BY l.repo_name, l.pr_number
),
-- One row per PR, streamed: the PRs are never a join's build side (every join below is written
-- with its smaller side first, which the job's planner keeps as the side it holds), and each
-- PR's reasons are computed from its own row, so memory does not grow with the lake.
decontaminate AS (
    SELECT DISTINCT repo FROM config_decontaminate
),
base AS (
    SELECT
        p.repo_name,
        p.number AS pr_number,
        p.merged,
        p.title,
        p.body,
        p.author_login,
        p.author_type,
        coalesce(f.files, 0) AS files,
        coalesce(f.changed_lines, 0) AS changed_lines,
        coalesce(f.code_files, 0) AS code_files,
        coalesce(f.noise_files, 0) AS noise_files,
        coalesce(it.linked_issues, 0) AS linked_issues,
        coalesce(it.issue_chars, 0) AS issue_chars,
        coalesce(it.known_issues, 0) AS known_issues,
        length(coalesce(p.title, '')) + length(coalesce(p.body, '')) AS pr_chars,
        s.status AS snapshot_status,
        d.repo IS NOT NULL AS decontaminated,
        c.min_files,
        c.max_files,
        c.max_changed_lines,
        c.min_issue_chars,
        c.require_linked_issue,
        c.pr_text_problems
    FROM decontaminate d
    RIGHT JOIN (
        issue_text it
        RIGHT JOIN (
            files f
            RIGHT JOIN (
                pr_snapshots s
                RIGHT JOIN (config_filters c CROSS JOIN pull_requests p)
                ON s.repo_name = p.repo_name AND s.pr_number = p.number
            ) ON f.repo_name = p.repo_name AND f.pr_number = p.number
        ) ON it.repo_name = p.repo_name AND it.pr_number = p.number
    ) ON d.repo = p.repo_name
),
-- Every reason that applies, in the codes' alphabetical order; NULL where one does not.
judged AS (
    SELECT
        *,
        array_compact(make_array(
            CASE WHEN is_bot_account(author_login, author_type) THEN 'bot_author' END,
            CASE WHEN botlike_text(title) OR botlike_text(body) THEN 'bot_text' END,
            CASE WHEN decontaminated THEN 'decontaminated' END,
            CASE WHEN snapshot_status = 'ok' AND files = 0 THEN 'empty_change' END,
            CASE WHEN (known_issues > 0 OR (linked_issues > 0 AND pr_text_problems = 'never'))
                AND issue_chars < min_issue_chars THEN 'issue_text_too_short' END,
            CASE WHEN files > 0 AND code_files = 0 THEN 'no_code_change' END,
            CASE WHEN linked_issues = 0 AND require_linked_issue AND pr_text_problems <> 'always'
                THEN 'no_linked_issue' END,
            CASE WHEN files > 0 AND noise_files = files THEN 'noise_only' END,
            CASE WHEN merged IS NULL OR NOT merged THEN 'not_merged' END,
            CASE WHEN merged AND snapshot_status IS NULL THEN 'not_snapshotted' END,
            CASE WHEN known_issues = 0 AND pr_text_problems <> 'never' AND pr_chars < min_issue_chars
                AND (linked_issues > 0 OR pr_text_problems = 'always') THEN 'pr_text_too_short' END,
            CASE WHEN snapshot_status = 'error' THEN 'snapshot_failed' END,
            CASE WHEN snapshot_status = 'ok' AND files > 0 AND files < min_files THEN 'too_few_files' END,
            CASE WHEN files > max_files THEN 'too_many_files' END,
            CASE WHEN changed_lines > max_changed_lines THEN 'too_many_lines' END
        )) AS reasons
    FROM base
)
SELECT
    repo_name,
    pr_number,
    cardinality(reasons) = 0 AS keep,
    reasons,
    files,
    changed_lines,
    code_files,
    noise_files,
    linked_issues,
    issue_chars,
    snapshot_status,
    CASE WHEN known_issues > 0 THEN 'issue' ELSE 'pr_text' END AS problem_source
FROM judged
