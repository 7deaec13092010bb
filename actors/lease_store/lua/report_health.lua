-- report_health: record a node's source health for a job (Redis time), list the able nodes.
--
-- KEYS[1] the job's health hash (ingestion:{J}:health): field <node> -> ms of its source's last
--         success; field failing:<node> -> ms since which its source has been failing (present
--         only while it fails)
-- ARGV[1] node
-- ARGV[2] age_ms of the node's last source success ('' when it never answered: not recorded)
-- ARGV[3] window_ms
-- ARGV[4] failing_ms: how long the node's source has been failing ('' when it is not: the
--         failing:<node> field is removed)
-- ARGV[5] forget_ms: another node whose last report is older than this (its last success, else
--         the start of its failing) is forgotten, both fields, as the node registry forgets it
--
-- Returns the nodes whose source answered within window_ms and is not failing.

return record_health(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
