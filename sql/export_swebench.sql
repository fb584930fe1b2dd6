-- The seed instances with what SWE-bench's fields need beside rl_seed's own columns: the PR's
-- opening time (NULL for PRs known only from git; the export falls back to the merge time) and
-- the package's version at the merge base (from the verify stage, when it ran).
SELECT
  s.instance_id,
  s.repo_name,
  s.split,
  s.problem_statement,
  s.oracle_patch,
  get_field(s.extra_info, 'pr_number') AS pr_number,
  get_field(s.extra_info, 'merge_base') AS merge_base,
  get_field(s.extra_info, 'base_sha') AS base_sha,
  get_field(s.extra_info, 'merged_at') AS merged_at,
  to_char(p.created_at, '%Y-%m-%dT%H:%M:%SZ') AS created_at,
  s.verified,
  s.fail_to_pass,
  s.pass_to_pass,
  s.env_key,
  v.package_version
FROM rl_seed s
LEFT JOIN pull_requests p
  ON p.repo_name = s.repo_name AND p.number = get_field(s.extra_info, 'pr_number')
LEFT JOIN pr_verification v
  ON v.repo_name = s.repo_name AND v.pr_number = get_field(s.extra_info, 'pr_number')
ORDER BY s.instance_id
