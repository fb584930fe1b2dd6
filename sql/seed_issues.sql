-- seed: the issues each PR resolves, with their text, in issue-number order.
SELECT l.repo_name,
       l.pr_number,
       l.issue_number,
       coalesce(i.title, '') AS title,
       coalesce(i.body, '') AS body
FROM pr_issue_links l
JOIN issues i ON i.repo_name = l.issue_repo_name AND i.number = l.issue_number
ORDER BY l.issue_number
