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
        c.min_files,
        c.max_files,
        c.max_changed_lines,
        c.min_issue_chars,
        c.require_linked_issue,
        c.pr_text_problems
    FROM pull_requests p
    CROSS JOIN config_filters c
    LEFT JOIN files f ON f.repo_name = p.repo_name AND f.pr_number = p.number
    LEFT JOIN issue_text it ON it.repo_name = p.repo_name AND it.pr_number = p.number
    LEFT JOIN pr_snapshots s ON s.repo_name = p.repo_name AND s.pr_number = p.number
),
reason_rows AS (
    SELECT repo_name, pr_number, 'not_merged' AS reason FROM base WHERE merged IS NULL OR NOT merged
    UNION ALL SELECT repo_name, pr_number, 'bot_author' FROM base WHERE is_bot_account(author_login, author_type)
    UNION ALL SELECT repo_name, pr_number, 'bot_text' FROM base WHERE botlike_text(title) OR botlike_text(body)
    UNION ALL SELECT repo_name, pr_number, 'not_snapshotted' FROM base WHERE merged AND snapshot_status IS NULL
    UNION ALL SELECT repo_name, pr_number, 'snapshot_failed' FROM base WHERE snapshot_status = 'error'
    UNION ALL SELECT repo_name, pr_number, 'empty_change' FROM base WHERE snapshot_status = 'ok' AND files = 0
    UNION ALL SELECT repo_name, pr_number, 'too_few_files' FROM base WHERE snapshot_status = 'ok' AND files > 0 AND files < min_files
    UNION ALL SELECT repo_name, pr_number, 'too_many_files' FROM base WHERE files > max_files
    UNION ALL SELECT repo_name, pr_number, 'too_many_lines' FROM base WHERE changed_lines > max_changed_lines
    UNION ALL SELECT repo_name, pr_number, 'no_code_change' FROM base WHERE files > 0 AND code_files = 0
    UNION ALL SELECT repo_name, pr_number, 'noise_only' FROM base WHERE files > 0 AND noise_files = files
    UNION ALL SELECT repo_name, pr_number, 'decontaminated' FROM base WHERE repo_name IN (SELECT repo FROM config_decontaminate)
    UNION ALL SELECT repo_name, pr_number, 'no_linked_issue' FROM base
        WHERE linked_issues = 0 AND require_linked_issue AND pr_text_problems <> 'always'
    UNION ALL SELECT repo_name, pr_number, 'issue_text_too_short' FROM base
        WHERE (known_issues > 0 OR (linked_issues > 0 AND pr_text_problems = 'never')) AND issue_chars < min_issue_chars
    UNION ALL SELECT repo_name, pr_number, 'pr_text_too_short' FROM base
        WHERE known_issues = 0 AND pr_text_problems <> 'never' AND pr_chars < min_issue_chars
          AND (linked_issues > 0 OR pr_text_problems = 'always')
),
reasons AS (
    SELECT repo_name, pr_number, array_agg(reason ORDER BY reason) AS reasons
    FROM reason_rows
    GROUP BY repo_name, pr_number
)
SELECT
    b.repo_name,
    b.pr_number,
    r.reasons IS NULL AS keep,
    coalesce(r.reasons, arrow_cast(make_array(), 'List(Utf8)')) AS reasons,
    b.files,
    b.changed_lines,
    b.code_files,
    b.noise_files,
    b.linked_issues,
    b.issue_chars,
    b.snapshot_status,
    CASE WHEN b.known_issues > 0 THEN 'issue' ELSE 'pr_text' END AS problem_source
FROM base b
LEFT JOIN reasons r ON r.repo_name = b.repo_name AND r.pr_number = b.pr_number
