-- Merged pull requests that resolve at least one issue, with the issue titles when known.
SELECT p.repo_name, p.number, p.title, l.issue_repo_name, l.issue_number, l.keyword, i.title AS issue_title
FROM pull_requests p
JOIN pr_issue_links l ON l.repo_name = p.repo_name AND l.pr_number = p.number
LEFT JOIN issues i ON i.repo_name = l.issue_repo_name AND i.number = l.issue_number
WHERE p.merged
ORDER BY p.repo_name, p.number, l.issue_number;
