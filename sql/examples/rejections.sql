-- What could not be ingested, per file and reason.
SELECT source_file, reason, count(*) AS lines, min(line_number) AS first_line
FROM events_rejected
GROUP BY source_file, reason
ORDER BY source_file, lines DESC;
