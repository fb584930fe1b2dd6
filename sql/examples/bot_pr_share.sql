-- Share of pull requests opened by bots (account type Bot or a [bot] login).
SELECT
    count(*) AS prs,
    sum(CASE WHEN author_type = 'Bot' OR author_login LIKE '%[bot]' THEN 1 ELSE 0 END) AS bot_prs,
    CAST(sum(CASE WHEN author_type = 'Bot' OR author_login LIKE '%[bot]' THEN 1 ELSE 0 END) AS DOUBLE) / count(*) AS bot_share
FROM pull_requests;
