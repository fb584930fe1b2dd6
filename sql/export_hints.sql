-- SWE-bench's hints_text: the comments on the issues a PR resolves that were written before the
-- PR was opened (SWE-bench takes those before its first commit, which the archive does not
-- date), oldest first. One row per comment, even when the PR links its issue twice.
SELECT DISTINCT s.instance_id, e.created_at, e.id, e.comment_body
FROM rl_seed s
JOIN pull_requests p
  ON p.repo_name = s.repo_name AND p.number = get_field(s.extra_info, 'pr_number')
JOIN pr_issue_links l
  ON l.repo_name = p.repo_name AND l.pr_number = p.number
JOIN events e
  ON e.type = 'IssueCommentEvent'
  AND e.repo_name = l.issue_repo_name
  AND e.number = l.issue_number
WHERE e.created_at < p.created_at
  AND (e.action IS NULL OR e.action = 'created')
  AND e.comment_body IS NOT NULL
  AND e.comment_body <> ''
ORDER BY s.instance_id, e.created_at, e.id
