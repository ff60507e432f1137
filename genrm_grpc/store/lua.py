"""Every script the stores run inside Redis, and what each one guarantees.

A script runs atomically in Redis: no other command of any client runs between its
first and last call, so each script below is one indivisible step of the store's
protocol. Which store module sends which (``genrm_grpc.store.redis``: ``APPLY``;
``genrm_grpc.store.shared``: the others), and what each guarantees:

- ``OPS`` is not run alone: it defines ``apply_ops``, the interpreter of the store's
  write operations (the table below), which ``APPLY`` and ``COMMIT`` both run, so a
  batch and a group commit write records the same way.
- ``APPLY`` writes one batch of records atomically. Fenced by an evaluation lease
  (``genrm_grpc.store.lease``), it writes nothing unless the lease's key still holds
  the lease's value, so a replica that paused past its lease cannot journal a verdict.
- ``LOAD`` reads a group (version, watermark, the key's cohort and tombstone, the
  newest attempt, the active counts) as one consistent snapshot.
- ``COMMIT`` writes a replica's decision only if the group's version is still the one
  it read (compare-and-set) and, for an evaluation's result, only while the
  evaluator's lease is current; it raises the version, so any later commit made on the
  older read is refused. Its channel messages are published after its writes.
- ``CENSUS`` counts the active, evaluating, retained tombstones and watermarks, after
  the retention indexes forget what has expired.
- ``CLAIM`` takes an evaluation over only when nobody holds its lease, always with a
  new fencing token (``INCR``: tokens only grow); ``RENEW`` and ``RELEASE`` act only
  for the lease's current holder.

``redis-py``'s ``register_script`` and ``APPLY_SHA`` name a script by its SHA-1; the
batch writer also loads ``APPLY`` in every transaction, so a Redis that forgot its
scripts in a restart cannot fail half a commit.
"""

from __future__ import annotations

import hashlib

# One batch, atomically: every write of the store goes through this script, one EVALSHA
# per batch (the commit loads it first, in the same transaction, so a Redis restart
# that emptied its script cache cannot fail half a commit).
#
# KEYS[1] is the lease key of a fenced batch (else the batch's first key, unused);
# ARGV[1] the lease value the batch is fenced by, or ''. A fenced batch whose lease is
# no longer that value writes nothing and returns 0. Then each operation takes its keys
# from KEYS and its arguments from ARGV, in order:
#
#   H   1 key  field value          HSET
#   D   1 key                       DEL
#   W   2 keys attempt text pxat    watermark: max(stored, attempt), expiry always new;
#                                   filed in the watermark index (KEYS[k + 1])
#   V   2 keys pass json q cohort entry
#                                   journal a pass (verdicts hash) and, when q is not
#                                   '', file it in the group's reuse index, which keeps
#                                   no TTL while an attempt may add verdicts
#   T   4 keys value pxat max now   a tombstone; the cohort's verdicts expire with it,
#                                   the reuse index with the group's last tombstone.
#                                   Filed in the tombstone index (KEYS[k + 3]), which
#                                   then drops what expired before ``now``; past ``max``
#                                   retained (0: no bound) the tombstones that expire
#                                   first go, with their verdicts (max_terminal_cohorts)
#   U   2 keys                      DEL a tombstone or watermark and take it out of its
#                                   index (KEYS[k + 1])
#   X   2 keys cohort               forget a cohort's verdicts, in the reuse index too
#                                   (other attempts' verdicts on a question stay)
#
#   I   1 key  field delta          HINCRBY (the shared active-cohort counts)
#   Z   1 key  score member         ZADD (deadline and evaluation indexes)
#   R   1 key  member               ZREM
#   S   1 key  value pxat           SET with an absolute expiry (an outcome's mailbox)
#   P   0 keys channel message      PUBLISH (after the writes before it, in the script)
#   L   2 keys owner ms fence_ms    a new evaluation lease unless one is held: INCR the
#                                   fence counter, SET the lease "<token>:<owner>" for
#                                   ms; the script returns that token (0 when a lease
#                                   was held: an eager evaluator took it at creation)
#
# The reuse index never re-encodes verdict numbers (cjson would round them): entries
# are strings. ``apply_ops`` is shared by the store's batch script and the replicas'
# group commit (genrm_grpc.store.shared).
OPS = """
local function drop_holder(rkey, q, cohort)
  local cur = redis.call('HGET', rkey, q)
  if not cur then return end
  local kept = {}
  for _, e in ipairs(cjson.decode(cur)) do
    if e[1] ~= cohort then kept[#kept + 1] = e end
  end
  if #kept == 0 then
    redis.call('HDEL', rkey, q)
  else
    redis.call('HSET', rkey, q, cjson.encode(kept))
  end
end

local function forget_verdicts(vkey, rkey, cohort)
  for _, raw in ipairs(redis.call('HVALS', vkey)) do
    local d = cjson.decode(raw)
    if type(d['s']) == 'string' then
      drop_holder(rkey, d['x'] .. ':' .. d['f'] .. ':' .. d['n'] .. ':'
        .. string.format('%d', d['k']) .. ':' .. (d['w'] and '1' or '0'), cohort)
    end
  end
  redis.call('DEL', vkey)
end

-- Retention of a tombstone index past its bound: the tombstones that expire first go,
-- with their journals. A member is a tombstone key PREFIX:t:{TAG}:COHORT, whose
-- journal is PREFIX:v:{TAG}:COHORT and whose group's reuse index is PREFIX:r:{TAG}.
local function retain(index, max, now)
  redis.call('ZREMRANGEBYSCORE', index, '-inf', now)
  if max <= 0 then return end
  local over = redis.call('ZCARD', index) - max
  if over <= 0 then return end
  local popped = redis.call('ZPOPMIN', index, over)
  for i = 1, #popped, 2 do
    local tkey = popped[i]
    local at = string.find(tkey, ':t:{', 1, true)
    local close = string.find(tkey, '}:', at, true)
    if at and close then
      local head, tag = string.sub(tkey, 1, at - 1), string.sub(tkey, at + 3, close)
      redis.call('DEL', tkey)
      forget_verdicts(head .. ':v:' .. tag .. string.sub(tkey, close + 1),
        head .. ':r:' .. tag, string.sub(tkey, close + 2))
    end
  end
end

local function apply_ops(k, a)
local token = 0
while a <= #ARGV do
  local op = ARGV[a]
  if op == 'H' then
    redis.call('HSET', KEYS[k], ARGV[a + 1], ARGV[a + 2])
    k, a = k + 1, a + 3
  elseif op == 'D' then
    redis.call('DEL', KEYS[k])
    k, a = k + 1, a + 1
  elseif op == 'W' then
    local attempt = ARGV[a + 1]
    local cur = redis.call('GET', KEYS[k])
    if cur then
      local c = string.match(cur, '^(%d+) ')
      if c and tonumber(c) > tonumber(attempt) then attempt = c end
    end
    redis.call('SET', KEYS[k], attempt .. ' ' .. ARGV[a + 2], 'PXAT', ARGV[a + 3])
    redis.call('ZADD', KEYS[k + 1], ARGV[a + 3], KEYS[k])
    k, a = k + 2, a + 4
  elseif op == 'V' then
    local q, cohort = ARGV[a + 3], ARGV[a + 4]
    redis.call('HSET', KEYS[k], ARGV[a + 1], ARGV[a + 2])
    if q ~= '' then
      local rkey = KEYS[k + 1]
      local kept = {}
      local cur = redis.call('HGET', rkey, q)
      if cur then
        for _, e in ipairs(cjson.decode(cur)) do
          if e[1] ~= cohort then kept[#kept + 1] = e end
        end
      end
      kept[#kept + 1] = {cohort, ARGV[a + 5]}
      redis.call('HSET', rkey, q, cjson.encode(kept))
      redis.call('HDEL', rkey, '~exp')
      redis.call('PERSIST', rkey)
    end
    k, a = k + 2, a + 6
  elseif op == 'T' then
    local pxat = ARGV[a + 2]
    redis.call('SET', KEYS[k], ARGV[a + 1], 'PXAT', pxat)
    if redis.call('EXISTS', KEYS[k + 1]) == 1 then redis.call('PEXPIREAT', KEYS[k + 1], pxat) end
    if redis.call('EXISTS', KEYS[k + 2]) == 1 then
      local cur = tonumber(redis.call('HGET', KEYS[k + 2], '~exp') or '0')
      if tonumber(pxat) > cur then
        redis.call('HSET', KEYS[k + 2], '~exp', pxat)
        redis.call('PEXPIREAT', KEYS[k + 2], pxat)
      end
    end
    redis.call('ZADD', KEYS[k + 3], pxat, KEYS[k])
    retain(KEYS[k + 3], tonumber(ARGV[a + 3]), ARGV[a + 4])
    k, a = k + 4, a + 5
  elseif op == 'U' then
    redis.call('DEL', KEYS[k])
    redis.call('ZREM', KEYS[k + 1], KEYS[k])
    k, a = k + 2, a + 1
  elseif op == 'X' then
    forget_verdicts(KEYS[k], KEYS[k + 1], ARGV[a + 1])
    k, a = k + 2, a + 2
  elseif op == 'I' then
    redis.call('HINCRBY', KEYS[k], ARGV[a + 1], ARGV[a + 2])
    k, a = k + 1, a + 3
  elseif op == 'Z' then
    redis.call('ZADD', KEYS[k], ARGV[a + 1], ARGV[a + 2])
    k, a = k + 1, a + 3
  elseif op == 'R' then
    redis.call('ZREM', KEYS[k], ARGV[a + 1])
    k, a = k + 1, a + 2
  elseif op == 'S' then
    redis.call('SET', KEYS[k], ARGV[a + 1], 'PXAT', ARGV[a + 2])
    k, a = k + 1, a + 3
  elseif op == 'P' then
    redis.call('PUBLISH', ARGV[a + 1], ARGV[a + 2])
    a = a + 3
  elseif op == 'L' then
    if redis.call('EXISTS', KEYS[k]) == 0 then
      token = redis.call('INCR', KEYS[k + 1])
      redis.call('PEXPIRE', KEYS[k + 1], ARGV[a + 3])
      redis.call('SET', KEYS[k], token .. ':' .. ARGV[a + 1], 'PX', ARGV[a + 2])
    end
    k, a = k + 2, a + 4
  else
    error('unknown store operation ' .. tostring(op))
  end
end
return token
end
"""

APPLY = (
    OPS
    + """
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
apply_ops(2, 2)
return 1
"""
)
APPLY_SHA = hashlib.sha1(APPLY.encode()).hexdigest()

# KEYS: version, watermark, counts, cohort K, tombstone K.
# ARGV: cohort key head and tombstone key head for the newest attempt, the key tail,
#       K's attempt, the principal's count field.
# Returns {version, watermark, total, principal's, K's fields, K's tombstone,
#          newest attempt, its fields, its tombstone}; fields are the header ``h`` and
#          the members' ``d:`` (digests, no texts).
LOAD = """
local function digests(key)
  local all = redis.call('HGETALL', key)
  local kept = {}
  for i = 1, #all, 2 do
    local f = all[i]
    if f == 'h' or string.sub(f, 1, 2) == 'd:' then
      kept[#kept + 1] = f
      kept[#kept + 1] = all[i + 1]
    end
  end
  return kept
end
local out = {}
out[1] = redis.call('GET', KEYS[1]) or '0'
out[2] = redis.call('GET', KEYS[2]) or ''
local counts = redis.call('HMGET', KEYS[3], '*', ARGV[5])
out[3] = counts[1] or '0'
out[4] = counts[2] or '0'
out[5] = digests(KEYS[4])
out[6] = redis.call('GET', KEYS[5]) or ''
out[7] = ''
out[8] = {}
out[9] = ''
local w = string.match(out[2], '^(%d+) ')
if w and w ~= ARGV[4] then
  out[7] = w
  out[8] = digests(ARGV[1] .. w .. ARGV[3])
  out[9] = redis.call('GET', ARGV[2] .. w .. ARGV[3]) or ''
end
return out
"""

# KEYS[1] version, KEYS[2] evaluation lease (or the version again); ARGV[1] the version
# read, ARGV[2] the evaluator's lease value or '', ARGV[3] the version's TTL (ms); then
# apply_ops from KEYS[3], ARGV[4]. Returns {1, lease token or 0}, {0, 0} when the group
# changed since the read, {-1, 0} when the evaluation lease is not the one presented.
COMMIT = (
    OPS
    + """
if (redis.call('GET', KEYS[1]) or '0') ~= ARGV[1] then return {0, 0} end
if ARGV[2] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[2] then return {-1, 0} end
redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local token = apply_ops(3, 4)
return {1, token}
"""
)

# KEYS: counts, evaluation index, tombstone index, watermark index. ARGV: now (ms).
# The indexes forget what expired first (amortised: each entry is dropped once).
CENSUS = """
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', ARGV[1])
return {tonumber(redis.call('HGET', KEYS[1], '*') or '0'), redis.call('ZCARD', KEYS[2]),
        redis.call('ZCARD', KEYS[3]), redis.call('ZCARD', KEYS[4])}
"""

# KEYS: lease, fence counter, evaluation index. ARGV: owner, lease ms, member, expiry ms,
# the fence counter's lifetime ms (as a commit's). Takes an evaluation over only when
# nobody holds its lease.
CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local tok = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('SET', KEYS[1], tok .. ':' .. ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
return tok
"""

# KEYS: lease, evaluation index. ARGV: holder's value, lease ms, member, expiry ms.
RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], 'XX', ARGV[4], ARGV[3])
return 1
"""

# KEYS: lease, evaluation index. ARGV: holder's value, member. Hands the evaluation to
# whichever replica looks next (its index entry is due at once).
RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZADD', KEYS[2], 'XX', 0, ARGV[2])
return 1
"""
