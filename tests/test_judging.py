"""The validator's judging queue (``node/roles/decisions/judging.py``): which submitted batch to fetch
next and from whom, back-off and rotation on failure, when a batch is unavailable, and the
bounds that keep a flood of announcements from crowding out real work."""

from node.roles.decisions.judging import JudgingQueue

WORKER = "0x" + "12" * 20
K1, K2 = (WORKER, b"\x01" * 32), ("0x" + "56" * 20, b"\x02" * 32)


def test_a_batch_is_fetched_only_once_submitted_and_announced():
    q = JudgingQueue()
    q.noticed(K1, "peerA", now=0)
    assert q.next_fetch(0) is None  # not on-chain: nothing to judge yet
    q.submitted(K1, units=96, policy_version=0, now=1)
    assert q.next_fetch(1) == (K1, "peerA")
    assert q.next_fetch(1) is None  # in flight
    q.fetched(K1)
    assert q.next_fetch(100) is None and q.unavailable(1000) == []  # judged once, never again
    q.noticed(K1, "peerB", now=2)
    q.submitted(K1, units=96, policy_version=0, now=2)
    assert q.next_fetch(3) is None


def test_oldest_submission_first():
    q = JudgingQueue()
    for key, t in ((K2, 5.0), (K1, 1.0)):
        q.noticed(key, "p", now=t)
        q.submitted(key, units=1, policy_version=0, now=t)
    assert q.next_fetch(10)[0] == K1
    assert q.next_fetch(10)[0] == K2


def test_fetches_run_side_by_side_but_one_per_worker():
    q = JudgingQueue()
    again = (WORKER, b"\x03" * 32)  # K1's worker's next batch
    for key, t in ((K1, 1.0), (again, 2.0), (K2, 3.0)):
        q.noticed(key, "p", now=t)
        q.submitted(key, units=1, policy_version=0, now=t)
    assert q.next_fetch(10)[0] == K1
    assert q.wake_at(10, can_fetch=False) is None  # no slot: a fetch's end wakes the role
    assert q.next_fetch(10)[0] == K2  # the older one is K1's worker's: it waits for K1
    assert q.next_fetch(10) is None
    assert q.wake_at(10) is None  # not "now" over and over (a loop of naps of 50 ms)
    q.fetched(K1)  # in judgement now: the worker's next batch may be fetched
    assert q.wake_at(10) == 10
    assert q.next_fetch(10)[0] == again


def test_retries_back_off_rotate_peers_and_end_in_unavailable():
    q = JudgingQueue(fetch_deadline_s=60, retry_s=1, retry_max_s=8)
    q.submitted(K1, units=1, policy_version=0, now=0)
    q.noticed(K1, "A", now=0)
    q.noticed(K1, "B", now=0)
    tries = []
    now = 0.0
    while (got := q.next_fetch(now)) is not None or q.wake_at(now) is not None:
        if got is None:
            now = q.wake_at(now)
            if now >= 60:
                break
            continue
        tries.append((now, got[1]))
        q.fetch_failed(K1, now)
    times = [t for t, _ in tries]
    assert times[:6] == [0, 1, 3, 7, 15, 23]  # 1, 2, 4, 8, then capped at 8
    assert [p for _, p in tries[:4]] == ["A", "B", "A", "B"]
    assert q.unavailable(59.9) == []
    # at the deadline the clock alone decides nothing: the last tries, the first at once
    # (the back-off would wait until 63), then after 1 and 2 s; only their failures make
    # the batch unavailable
    assert q.wake_at(59.9) == 60
    assert q.unavailable(60) == []
    late = []
    now = 60.0
    while not (gone := q.unavailable(now)):
        got = q.next_fetch(now)
        if got is None:
            now = q.wake_at(now)
            continue
        late.append(now)
        q.fetch_failed(K1, now)
    assert late == [60, 61, 63, 67, 75, 83] and gone == [K1]  # 3 from each of A and B
    assert q.unavailable(now + 1) == []  # reported once
    assert q.next_fetch(now + 1) is None


def test_the_validators_own_delay_never_makes_a_served_batch_unavailable():
    """A validator busy judging a backlog (or waiting for a step announcement, or for
    weights) past a key's deadline has not asked for it: it asks then, and judges what it
    gets (found by the cheating matrix: an other_weights batch of a live worker was
    rejected as unavailable, and its worker slashed for the validator's delay)."""
    q = JudgingQueue(fetch_deadline_s=60)
    q.noticed(K1, "A", now=0)
    q.submitted(K1, units=1, policy_version=0, now=0)
    q.noticed(K2, "A", now=0)
    q.submitted(K2, units=1, policy_version=0, now=0)
    assert q.next_fetch(1) == (K1, "A")
    q.fetch_failed(K1, 2)  # one early failure, then the validator was busy elsewhere
    assert q.unavailable(200) == []  # never asked (K2), or not asked since the deadline (K1)
    assert q.next_fetch(200) == (K1, "A") and q.next_fetch(200) == (K2, "A")
    q.fetched(K1)
    q.fetched(K2)
    assert q.unavailable(300) == [] and q.next_fetch(300) is None


def test_a_batch_nobody_announced_is_unavailable_at_the_deadline():
    q = JudgingQueue(fetch_deadline_s=30)
    q.submitted(K1, units=1, policy_version=0, now=10)
    assert q.wake_at(10) == 40
    assert q.unavailable(39) == [] and q.unavailable(40) == [K1]  # nobody to ask


def test_a_batch_announced_while_the_validator_was_down_is_fetched_from_its_worker():
    """A restarted validator missed the announcement: it asks the peer the worker
    registered on-chain (found by the chaos run: such batches were rejected as unavailable
    after the fetch deadline, honest stake slashed). Only that peer can serve a batch that
    passes: it is asked first, then the announcers (one may serve evidence: the worker's
    batch signed with a key it did not register)."""
    q = JudgingQueue(fetch_deadline_s=30)
    q.submitted(K1, units=1, policy_version=0, now=10, holder="worker-peer")
    assert q.next_fetch(10) == (K1, "worker-peer")
    q.noticed(K2, "announcer", now=10)
    q.submitted(K2, units=1, policy_version=0, now=11, holder="worker-peer")
    q.fetched(K1)
    assert q.next_fetch(11) == (K2, "worker-peer")
    q.fetch_failed(K2, 11)
    assert q.next_fetch(12) == (K2, "announcer")
    assert q.entries[K2].peers == ["worker-peer", "announcer"]
    q.submitted(K2, units=1, policy_version=0, now=12, holder="someone-else")  # once only
    assert q.entries[K2].peers == ["worker-peer", "announcer"]


def test_free_peer_ids_announcing_a_withheld_batch_do_not_delay_its_unavailability():
    """Each peer of a key is asked three times after the deadline before it can be called
    unavailable: 200 free ids announcing a batch its worker withholds pushed that to
    18,541 s, past the verdict window (no verdict, no slash). A key keeps its registered
    peer and at most ``max_peers`` announcers, before or after the chain names it."""
    for holder, asked in (
        ("worker-peer", ["a0", "a1", "a2", "a3", "worker-peer"]),
        (None, ["a0", "a1", "a2", "a3"]),
    ):
        q = JudgingQueue(fetch_deadline_s=30, retry_s=1, retry_max_s=30)
        for i in range(200):
            q.noticed(K1, f"a{i}", now=0)
        q.submitted(K1, units=1, policy_version=0, now=0, holder=holder)
        for i in range(200, 210):
            q.noticed(K1, f"a{i}", now=1)  # after its submission too
        now, peers = 30.0, []
        while not q.unavailable(now):
            if (got := q.next_fetch(now)) is None:
                now = q.wake_at(now)
                continue
            peers.append(got[1])
            q.fetch_failed(K1, now)
        assert sorted(set(peers)) == asked and len(peers) == 3 * len(asked)
        assert now < 30 + 600  # minutes after the deadline, not hours


def test_announcements_filling_the_queue_never_keep_a_submission_out():
    """Free peer ids, 64 announcements each, filled the queue (``max_pending``) with keys
    never submitted: a real submission found it full and was dropped, never judged. A
    submitted key is always taken; only announcements are bounded."""
    q = JudgingQueue(max_pending=8, per_peer_unsubmitted=2)
    for i in range(8):
        for j in range(2):
            q.noticed((WORKER, bytes([0x80 + i, j]) * 16), f"sybil-{i}", now=0)
    assert len(q.entries) == 8 and q.dropped == 8  # the announcements are bounded
    q.noticed(K1, "worker-peer", now=1)  # the honest notice finds the queue full
    assert K1 not in q.entries and q.dropped == 9
    q.submitted(K1, units=5, policy_version=0, now=2, holder="worker-peer")
    assert q.next_fetch(2) == (K1, "worker-peer")
    q.fetched(K1)
    q.judged(K1)
    assert K1 in q.closed


def test_a_fetch_in_flight_is_not_declared_unavailable():
    q = JudgingQueue(fetch_deadline_s=30)
    q.submitted(K1, units=1, policy_version=0, now=0)
    q.noticed(K1, "A", now=0)
    assert q.next_fetch(29)
    assert q.unavailable(31) == []  # the fetch decides
    q.fetch_failed(K1, 31)  # the first of the last tries (it failed after the deadline)
    assert q.unavailable(40) == []
    q.next_fetch(40)
    q.fetch_failed(K1, 40)
    q.next_fetch(42)
    q.fetch_failed(K1, 42)
    assert q.next_fetch(50) is None
    assert q.unavailable(50) == [K1]


def test_an_announcement_flood_is_bounded():
    q = JudgingQueue(max_pending=3)
    for i in range(10):
        q.noticed((WORKER, bytes([i]) * 32), "flooder", now=0)
    assert len(q.entries) == 3 and q.dropped == 7


def test_one_peers_flood_of_unsubmitted_keys_cannot_crowd_out_the_others():
    q = JudgingQueue(fetch_deadline_s=30, per_peer_unsubmitted=4)
    for i in range(50):
        q.noticed((WORKER, bytes([i]) * 32), "flooder", now=0)
    assert len(q.entries) == 4 and q.dropped == 46
    mine = (WORKER, b"\xc8" * 32)
    q.noticed(mine, "honest", now=1)  # another peer's announcement still gets in
    q.submitted(mine, 10, 0, now=1)
    assert q.next_fetch(1) == (mine, "honest")
    # a flooder's key that is submitted after all is work like any other: no longer counted
    q.submitted((WORKER, bytes([0]) * 32), 10, 0, now=2)
    q.noticed((WORKER, bytes([60]) * 32), "flooder", now=2)
    assert (WORKER, bytes([60]) * 32) in q.entries


def test_announced_keys_never_submitted_are_forgotten_after_the_fetch_deadline():
    q = JudgingQueue(fetch_deadline_s=30, per_peer_unsubmitted=2)
    q.noticed((WORKER, b"\x01" * 32), "flooder", now=0)
    q.noticed((WORKER, b"\x02" * 32), "flooder", now=0)
    q.noticed((WORKER, b"\x03" * 32), "flooder", now=10)  # over its share
    assert q.dropped == 1 and len(q.entries) == 2
    q.noticed((WORKER, b"\x03" * 32), "flooder", now=31)  # the first two expired
    assert q.expired == 2 and list(q.entries) == [(WORKER, b"\x03" * 32)]


def test_the_versions_of_work_not_judged_yet_are_the_weights_to_keep():
    """``versions``: the policy versions of submitted keys still to fetch or retry (the
    validator keeps their weights however far the run moves on); a key announced but not
    submitted has none yet, a fetched or unavailable key needs none any more."""
    q = JudgingQueue(fetch_deadline_s=60)
    q.noticed(K1, "A", now=0)
    assert q.versions() == set()  # not on-chain: no version known
    q.submitted(K1, units=1, policy_version=3, now=0)
    q.submitted(K2, units=1, policy_version=5, now=0)
    assert q.versions() == {3, 5}
    assert q.next_fetch(0) == (K1, "A")
    q.fetch_failed(K1, now=1)
    assert q.versions() == {3, 5}  # retried later: still needed
    assert q.next_fetch(2) == (K1, "A")
    q.fetched(K1)
    assert q.versions() == {3, 5}  # in judgement: it may have to be judged again
    q.judged(K1)
    assert q.versions() == {5}
    assert q.unavailable(61) == [K2]  # nobody announced it: rejected, its weights not needed
    assert q.versions() == set()


def test_a_batch_that_could_not_be_judged_is_fetched_again_later_then_given_up():
    """No weights of its version here, or the batch checker failed: the batch is fetched
    and judged again after 30 s, then 60 s (also past the fetch deadline, where a key never
    fetched gets its last tries at once), and given up after the third failure."""
    q = JudgingQueue(fetch_deadline_s=60, check_retry_s=30, check_tries=3)
    q.submitted(K1, units=1, policy_version=3, now=0)
    q.noticed(K1, "A", now=0)
    assert q.next_fetch(0) == (K1, "A")
    q.fetched(K1)
    assert q.check_failed(K1, now=5) == 35
    assert q.next_fetch(34) is None and q.wake_at(34) == 35
    assert q.versions() == {3}  # its weights are still needed
    assert q.next_fetch(35) == (K1, "A")
    q.fetched(K1)
    assert q.check_failed(K1, now=70) == 130  # past the deadline: the back-off still decides
    assert q.next_fetch(71) is None and q.unavailable(71) == [] and q.wake_at(71) == 130
    assert q.next_fetch(130) == (K1, "A")
    q.fetched(K1)
    assert q.check_failed(K1, now=131) is None
    assert q.given_up == 1 and q.versions() == set() and q.waiting() == 0
    q.noticed(K1, "A", now=132)
    q.submitted(K1, units=1, policy_version=3, now=132)
    assert q.next_fetch(500) is None and q.unavailable(500) == []  # never again


def test_judged_keys_keep_no_entry_and_their_announcements_cost_nothing():
    """A judged key leaves the queue (its walks stay as short as the backlog) but is still
    never judged again; workers announce a batch again until they see its verdict, and
    those announcements neither wait as unsubmitted keys nor fill the peer's share."""
    q = JudgingQueue(per_peer_unsubmitted=4)
    keys = [(WORKER, bytes([i]) * 32) for i in range(50)]
    for i, key in enumerate(keys):
        q.noticed(key, "A", now=i)
        q.submitted(key, units=1, policy_version=0, now=i)
        assert q.next_fetch(i)[0] == key
        q.fetched(key)
        q.judged(key)
    assert q.entries == {} and q.waiting() == 0
    for key in keys:  # announced again
        q.noticed(key, "A", now=60)
    assert q.entries == {} and q.dropped == 0
    fresh = [(WORKER, bytes([200 + i]) * 32) for i in range(4)]
    for key in fresh:  # new batches of the same peer are still taken, up to its share
        q.noticed(key, "A", now=61)
    assert list(q.entries) == fresh
    q.noticed(keys[0], "A", now=62)  # a judged key: not a refusal of the full share either
    assert q.dropped == 0


def test_an_unsubmitted_key_counts_against_its_first_announcer_only():
    """The peer whose announcement brought a key in holds its share, however many other
    peers announce the key after it."""
    q = JudgingQueue(per_peer_unsubmitted=1)
    q.noticed(K1, "A", now=0)
    q.noticed(K1, "B", now=0)  # B announces it too: still A's
    q.noticed(K2, "A", now=1)  # A's share is full
    assert list(q.entries) == [K1] and q.dropped == 1
    q.noticed(K2, "B", now=1)  # B's is not
    assert list(q.entries) == [K1, K2] and q.dropped == 1


def test_every_batch_given_up_is_counted():
    q = JudgingQueue(check_tries=1)
    for key in (K1, K2):
        q.submitted(key, units=1, policy_version=0, now=0)
        q.noticed(key, "A", now=0)
        assert q.next_fetch(0)[0] == key
        q.fetched(key)
        assert q.check_failed(key, now=1) is None
    assert q.given_up == 2


def test_the_role_wakes_at_once_for_a_key_nobody_serves_and_never_for_one_in_judgement():
    q = JudgingQueue(fetch_deadline_s=60, retry_s=1, last_tries=1)
    q.submitted(K1, units=1, policy_version=0, now=0)
    q.noticed(K1, "A", now=0)
    assert q.next_fetch(0) == (K1, "A")
    q.fetched(K1)  # in judgement: nothing to wake for
    assert q.wake_at(5) is None
    q.submitted(K2, units=1, policy_version=0, now=0)
    q.noticed(K2, "A", now=0)
    assert q.next_fetch(60) == (K2, "A")
    q.fetch_failed(K2, now=60)  # its last try failed: unavailable, due now
    assert q.wake_at(61) == 61 and q.wake_at(61, can_fetch=False) == 61
    assert q.unavailable(61) == [K2]


def test_a_key_waiting_for_its_workers_fetch_does_not_hide_the_next_keys_time():
    q = JudgingQueue(fetch_deadline_s=60)
    again = (WORKER, b"\x03" * 32)  # K1's worker's next batch
    for key in (K1, again, K2):
        q.submitted(key, units=1, policy_version=0, now=0)
    q.noticed(K1, "A", now=0)
    assert q.next_fetch(0) == (K1, "A")  # K1's worker busy: ``again`` waits for that fetch
    q.noticed(again, "A", now=0)
    assert q.wake_at(5) == 60  # K2: nobody announced it, unavailable at its deadline
