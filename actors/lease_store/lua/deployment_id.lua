-- deployment_id: the Redis deployment's own identity, created once by whoever asks first.
--
-- KEYS[1] the identity's key (ingestion:deployment)
-- ARGV[1] a fresh id, kept only when the deployment has none yet (SET NX)
--
-- Returns the id in force: the one set before, or ARGV[1]. Written like any key, so replicated
-- with the data it names: a replica promoted by Sentinel answers the same id, a different server
-- (or one that lost its data) another.

redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
