-- Events per type and day: the first thing to look at after an ingest.
SELECT event_date, type, count(*) AS events
FROM events
GROUP BY event_date, type
ORDER BY event_date, events DESC, type;
