-- seed: the relevant-but-unchanged files of each PR, most relevant first.
SELECT repo_name, pr_number, path, blob_sha
FROM pr_relevant_files
ORDER BY repo_name, pr_number, rank
