-- seed: the files each PR changed, with the blobs before and after and the file's patch.
SELECT repo_name, pr_number, path, old_path, status, old_blob, new_blob, patch, is_binary, language, old_mode, new_mode
FROM pr_files
ORDER BY repo_name, pr_number, path
