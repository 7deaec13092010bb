-- watch_edit_done: the end of an operator's edit of a watch list held in Redis
-- (ingestion/watchlist/lists.py): the version counter moves when the edit changed a member, or when
-- it found the edit-in-progress marker set (an edit before it was cut off, or one running beside
-- it), so every node reloads; then the marker is cleared.
--
-- KEYS[1] the version counter     KEYS[2] the edit-in-progress marker
-- ARGV[1] how many members the edit changed     ARGV[2] '1' when it found the marker set
--
-- Returns nothing. The version moves if either holds: the nodes then read the set again.

if tonumber(ARGV[1]) > 0 or ARGV[2] == '1' then
  redis.call('INCR', KEYS[1])
end
redis.call('DEL', KEYS[2])
