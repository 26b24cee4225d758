"""Weights sealed once per version (rlctl.net.sealed): seals over CURVE, ciphertexts over a socket without it."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import zmq

from conftest import free_ports, wait_for
from rlctl.models import QNetwork, parameter_digest
from rlctl.net import sealed as sealed_mod
from rlctl.net import wire
from rlctl.net.sealed import BULK, SEALED, BulkPublisher, BulkSubscriber, Seal, chunk_spans, seal, unseal
from rlctl.net.weights import FULL, WeightPublisher, WeightSubscriber

torch.set_num_threads(1)


@pytest.fixture
def sealed_net():
    """A CURVE context, and free loopback endpoints for a publisher's weights and bulk sockets."""
    net = wire.SecureContext(wire.CurveKeys.generate())
    try:
        yield net, *[f"tcp://127.0.0.1:{p}" for p in free_ports(2)]
    finally:
        net.close()


def _bump(model) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1)


def test_a_sealed_vector_opens_only_with_its_seal_and_unaltered():
    vector = np.random.default_rng(0).standard_normal(10_001).astype(np.float32)
    s, ciphertext = seal(vector, (3, 7), b"t" * 16)
    assert ciphertext.nbytes == vector.nbytes and not np.array_equal(ciphertext.view(np.float32), vector)
    out = np.zeros_like(vector)
    assert unseal(s, ciphertext, out) and np.array_equal(out, vector)
    again, ciphertext_again = seal(vector, (3, 7), b"t" * 16)
    assert again.key != s.key and not np.array_equal(ciphertext, ciphertext_again)  # a fresh key every time
    forged = ciphertext.copy()
    forged[5000] ^= 1
    untouched = np.zeros_like(vector)
    assert not unseal(s, forged, untouched) and not untouched.any()
    assert not unseal(again, ciphertext, untouched) and not untouched.any()
    assert not unseal(s, ciphertext[:-4], np.zeros(10_000, np.float32))
    # Parameters sealed one after another as one stream open as their concatenation (no flat copy is made).
    pieces, into = [vector[:4000], vector[4000:4001], vector[4001:]], np.zeros(vector.nbytes, np.uint8)
    s_pieces, c_pieces = seal(pieces, (3, 8), b"t" * 16, into)
    assert c_pieces is into and unseal(s_pieces, c_pieces, out) and np.array_equal(out, vector)
    tiny = np.ones(3, np.float32)  # shorter than one AES block
    s3, c3 = seal(tiny, (0, 1), b"t" * 16)
    out3 = np.zeros(3, np.float32)
    assert unseal(s3, c3, out3) and np.array_equal(out3, tiny)


def test_a_ciphertext_is_cut_into_chunks_each_with_its_digest():
    assert chunk_spans(10) == [(0, 10)] and chunk_spans(0) == [(0, 0)]
    assert chunk_spans(40_000_000) == [(a, min(a + (4 << 20), 40_000_000)) for a in range(0, 40_000_000, 4 << 20)]
    big = chunk_spans(1 << 31)  # past 256 chunks of 4 MiB, chunks grow: a seal's digests fit in a wire header
    assert len(big) == 256 and big[-1][1] == 1 << 31
    vector = np.random.default_rng(1).standard_normal(2_500_000).astype(np.float32)  # 10 MB: 3 chunks
    s, ciphertext = seal(vector, (1, 1), b"t" * 16)
    assert len(s.digests) == 3 and Seal.from_message(wire.Message(SEALED, "learner-0", 1, s.meta())) == s
    forged = ciphertext.copy()
    forged[-1] ^= 1  # in the last chunk only
    out = np.zeros_like(vector)
    assert not unseal(s, forged, out) and not out.any()
    assert unseal(s, ciphertext, out) and np.array_equal(out, vector)


@pytest.mark.parametrize("meta", [
    {}, {"gen": "1"}, {"gen": True}, {"gen": 1, "key": "zz" * 32, "iv": "00" * 16, "digests": "00" * 32,
                                      "token": "00" * 16},
    {"gen": 1, "key": "00" * 31, "iv": "00" * 16, "digests": "00" * 32, "token": "00" * 16},
    {"gen": 1, "key": "00" * 32, "iv": 5, "digests": "00" * 32, "token": "00" * 16},
    {"gen": 1, "key": "00" * 32, "iv": "00" * 16, "digests": "", "token": "00" * 16},
    {"gen": 1, "key": "00" * 32, "iv": "00" * 16, "digests": "00" * 33, "token": "00" * 16},
    {"gen": 1, "key": "00" * 32, "iv": "00" * 16, "digests": "00" * 32 * 257, "token": "00" * 16},
])
def test_a_malformed_seal_is_none(meta):
    assert Seal.from_message(wire.Message(SEALED, "learner-0", 1, meta)) is None


def test_every_network_subscriber_opens_one_sealing_per_version(sealed_net, monkeypatch):
    """Three subscribers with a bulk socket take each version from one sealing (a re-publication reuses it); none
    of them is sent the plain vector, and one without a bulk socket still takes it over CURVE."""
    net, endpoint, bulk = sealed_net
    sealings = []
    real_seal = sealed_mod.seal
    monkeypatch.setattr(sealed_mod, "seal", lambda *a: sealings.append(a[1]) or real_seal(*a))
    torch.manual_seed(0)
    learner = QNetwork((4,), 2, (32, 32))
    pub = WeightPublisher(net, endpoint, "learner-0", bulk=bulk, generation=5)
    subs = [WeightSubscriber(net, endpoint, QNetwork((4,), 2, (32, 32)), bulk=bulk) for _ in range(3)]
    plain = WeightSubscriber(net, endpoint, QNetwork((4,), 2, (32, 32)))
    everyone = [*subs, plain]
    for version in (1, 2):
        _bump(learner)

        def arrived(v=version) -> bool:
            if pub.joined() or all(s.version < v for s in everyone):
                pub.publish(v, learner)
            for s in everyone:
                s.wait(1)
                s.poll()
            return all(s.version == v for s in everyone)
        wait_for(arrived, 10, interval=0.001, what=f"version {version} at every subscriber")
        assert {parameter_digest(s.model) for s in everyone} == {parameter_digest(learner)}
    assert sealings == [(5, 1), (5, 2)]
    assert 1 <= len(pub.bulk.buffers) <= 3
    assert pub.wanted(SEALED) and pub.wanted(FULL)
    assert all(s.dropped == 0 for s in everyone) and all(s.bulk is not None for s in subs)


def test_ciphertexts_from_anyone_but_the_sealer_are_dropped_counted_and_change_nothing(sealed_net):
    """A second bulk socket the subscriber also listens to (a peer on the path, who even knows the token) sends a
    ciphertext of the right stamp and size: it does not match the digest the seal brought over CURVE, so it is
    dropped and counted, and the weights stay; a peer subscribing to the real bulk socket without the token is sent
    nothing and makes the publisher send nothing again."""
    net, endpoint, bulk = sealed_net
    forger_endpoint = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    torch.manual_seed(0)
    learner = QNetwork((4,), 2, (8,))
    pub = WeightPublisher(net, endpoint, "learner-0", bulk=bulk, generation=1)
    sub = WeightSubscriber(net, endpoint, QNetwork((4,), 2, (8,)), bulk=[bulk, forger_endpoint])
    forger = net.plain_server(zmq.XPUB, forger_endpoint, maxmsgsize=1 << 20)
    outsider = net.plain_client(zmq.SUB, bulk)
    outsider.setsockopt(zmq.SUBSCRIBE, b"")

    def arrived() -> bool:
        if pub.joined() or sub.version < 1:
            pub.publish(1, learner)
        sub.wait(1)
        sub.poll()
        return sub.version == 1
    wait_for(arrived, 10, interval=0.001, what="version 1")
    before = parameter_digest(sub.model)
    time.sleep(0.2)
    assert not pub.joined()  # the outsider's subscription to everything counts for nothing
    token = pub.bulk.token
    wait_for(lambda: forger.poll(10) and forger.recv() == b"\x01" + token, 5, what="the subscriber at the forger")
    # The seal of version 2 comes over CURVE; the forger's ciphertext for it is there first.
    s2, _ = pub.bulk.sealed((1, 2), lambda: np.ones(sub.size, np.float32))
    fake = np.frombuffer(np.full(sub.size, 7.0, np.float32).tobytes(), np.uint8)
    frames = [token, *wire.encode(BULK, "learner-0", 2, {"gen": 1, "chunk": 0}, {"sealed": fake})]
    forger.send_multipart(frames)
    wait_for(lambda: sub.bulk.sock.poll(10), 5, what="the forged ciphertext")
    wire.send(pub.sock, SEALED, "learner-0", 2, s2.meta())
    wait_for(lambda: (sub.poll(), sub.dropped >= 1)[1], 5, what="the forgery dropped")
    assert sub.version == 1 and parameter_digest(sub.model) == before
    assert not outsider.poll(200)  # never sent a ciphertext


def test_ciphertext_buffers_are_written_again_only_once_zeromq_let_go_of_them(sealed_net):
    """Versions published back to back, faster than a subscriber takes them: each buffer is rewritten only after
    its send is done, so every version the subscriber opens is whole (its digest checked) and the newest arrives."""
    net, endpoint, bulk = sealed_net
    torch.manual_seed(0)
    learner = QNetwork((4,), 2, (256, 256))
    pub = WeightPublisher(net, endpoint, "learner-0", bulk=bulk, generation=2)
    sub = WeightSubscriber(net, endpoint, QNetwork((4,), 2, (256, 256)), bulk=bulk)

    def holds(version: int) -> bool:
        if pub.joined() or sub.version < version:
            pub.publish(version, learner)
        sub.wait(1)
        sub.poll()
        return sub.version == version
    wait_for(lambda: holds(1), 10, interval=0.001, what="version 1")
    for version in range(2, 40):
        _bump(learner)
        pub.publish(version, learner)
        sub.poll()
    wait_for(lambda: holds(39), 10, interval=0.001, what="the newest version")
    assert parameter_digest(sub.model) == parameter_digest(learner)
    assert sub.dropped == 0 and len(pub.bulk.buffers) <= 3


def test_chunks_open_once_all_have_come_each_checked_as_it_comes_whatever_came_first(sealed_net):
    """A version of three chunks: chunks that come before their seal wait for it; a forged chunk (right token,
    stamp, index and size) is dropped and counted while the real one still completes the version; a seal whose
    chunks do not fit the model's size is dropped; chunks of a version as old as the one opened are late."""
    net, _, bulk = sealed_net
    forger_endpoint = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    size = 2_500_000
    pub = BulkPublisher(net, bulk)
    sub = BulkSubscriber(net, [bulk, forger_endpoint], 4 * size)
    forger = net.plain_server(zmq.XPUB, forger_endpoint, maxmsgsize=64)
    rng = np.random.default_rng(2)
    vectors = {v: rng.standard_normal(size).astype(np.float32) for v in (1, 2, 3)}
    out = np.zeros(size, np.float32)

    def arrive(until, publish=None) -> None:
        def done():
            if publish is not None:
                pub.read_subscriptions()
                if pub.joins:  # subscribed: what was sent before it went to nobody
                    pub.send("learner-0", *publish)
            sub.sock.poll(10)
            sub.take_waiting()
            return until()
        wait_for(done, 10, interval=0.001, what="chunks")

    s1, c1 = pub.sealed((1, 1), lambda: vectors[1])
    sub.take_seal(s1)  # subscribes to the token
    arrive(lambda: sub.ready((-1, -1)), publish=(s1, c1))
    assert sub.open_newest(out, (-1, -1)) == (1, 1) and np.array_equal(out, vectors[1])

    s2, c2 = pub.sealed((1, 2), lambda: vectors[2])
    pub.send("learner-0", s2, c2)  # every chunk before the seal
    arrive(lambda: len(sub.waiting.get(s2.id, [])) == 3)
    assert not sub.ready((1, 1))
    sub.take_seal(s2)
    assert sub.ready((1, 1)) and sub.open_newest(out, (1, 1)) == (1, 2) and np.array_equal(out, vectors[2])

    s3, c3 = pub.sealed((1, 3), lambda: vectors[3])
    sub.take_seal(s3)
    wait_for(lambda: forger.poll(10) and forger.recv() == b"\x01" + pub.token, 5, what="the subscriber at the forger")
    a, b = chunk_spans(c3.nbytes)[1]
    forged = c3[a:b].copy()
    forged[7] ^= 1
    forger.send_multipart([pub.token, *wire.encode(BULK, "learner-0", 3, {"gen": 1, "chunk": 1}, {"sealed": forged})])
    arrive(lambda: sub.dropped == 1)
    assert not sub.ready((1, 2))
    pub.send("learner-0", s3, c3)
    arrive(lambda: sub.ready((1, 2)))
    assert sub.open_newest(out, (1, 2)) == (1, 3) and np.array_equal(out, vectors[3])

    pub.send("learner-0", s2, c2)  # late: nothing kept, nothing counted
    time.sleep(0.1)
    sub.take_waiting()
    assert not sub.assemblies and not sub.waiting and sub.dropped == 1
    tiny, _ = seal(np.ones(3, np.float32), (1, 4), pub.token)
    sub.take_seal(tiny)  # one chunk's digest for a model of three
    assert sub.dropped == 2 and tiny.id not in sub.seals
