"""Weights from learner rank 0 to subscribers: the shared-memory board, and the network path beside it."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
import torch
import zmq

from rlctl import wire
from rlctl.models import QNetwork, flat_parameters, parameter_digest
from rlctl.weights import FULL, NOTICE, WeightBoard, WeightPublisher, WeightSubscriber

torch.set_num_threads(1)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_board_round_trip_rejects_other_versions_and_sizes(tmp_path):
    path = str(tmp_path / "board")
    writer = WeightBoard.create(path, 5)
    reader = WeightBoard.open(path, 5)
    out = np.zeros(5, np.float32)
    assert not reader.read(0, 0, out)  # nothing written yet: -1 in both slots
    writer.write(1, 7, [torch.arange(2.0), torch.arange(2.0, 5.0).reshape(3, 1)])  # tensors, flattened in order
    assert reader.read(1, 7, out) and out.tolist() == [0, 1, 2, 3, 4]
    assert not reader.read(1, 8, out) and not reader.read(0, 7, out)
    writer.headers[1][0] = -1  # what a reader sees while the writer is inside this slot
    assert not reader.read(1, 7, out)
    with pytest.raises(ValueError):
        WeightBoard.open(path, 6)


def test_local_subscribers_read_the_board_and_remote_ones_the_network(tmp_path):
    keys = wire.CurveKeys.generate()
    net = wire.SecureContext(keys)
    endpoint = f"tcp://127.0.0.1:{_port()}"
    board = str(tmp_path / "rlctl-t-weights")
    try:
        pub = WeightPublisher(net, endpoint, "learner-0", board)
        torch.manual_seed(0)
        learner = QNetwork((4,), 2, (32, 32))
        local = WeightSubscriber(net, endpoint, QNetwork((4,), 2, (32, 32)), board)
        remote = WeightSubscriber(net, endpoint, QNetwork((4,), 2, (32, 32)))
        # What reaches a notice subscriber: publisher-side filtering means it never receives the parameter vector.
        spy = net.client(zmq.SUB, endpoint, subscribe=wire.kind_prefix(NOTICE))
        time.sleep(0.3)  # subscriptions reach the publisher
        for version in (1, 2, 3):
            with torch.no_grad():
                for p in learner.parameters():
                    p.add_(0.1)
            pub.publish(version, learner)
            deadline = time.time() + 10
            while (local.version, remote.version) != (version, version) and time.time() < deadline:
                local.poll()
                remote.poll()
                time.sleep(0.001)
            assert (local.version, remote.version) == (version, version)
            assert parameter_digest(local.model) == parameter_digest(remote.model) == parameter_digest(learner)
        assert pub.wanted(FULL) and pub.wanted(NOTICE)
        pub.publish(3, learner)  # a re-publication rewrites nothing and changes nothing
        assert pub.written == 3 and not local.poll()
        seen = []
        while spy.poll(200):
            _, msg = wire.recv(spy)
            seen.append((msg.kind, msg.version, sorted(msg.arrays)))
        assert seen == [(NOTICE, v, []) for v in (1, 2, 3, 3)]
        assert local.dropped == remote.dropped == 0
        pub.close()
        assert not (tmp_path / "rlctl-t-weights").exists()
    finally:
        net.close()


def test_full_and_notice_prefixes_select_one_kind():
    full = wire.encode(FULL, "l", 1, None, {"params": np.zeros(3, np.float32)})[0]
    notice = wire.encode(NOTICE, "l", 1, {"slot": 0})[0]
    assert full.startswith(wire.kind_prefix(FULL)) and not notice.startswith(wire.kind_prefix(FULL))
    assert notice.startswith(wire.kind_prefix(NOTICE)) and not full.startswith(wire.kind_prefix(NOTICE))


def test_board_subscriber_with_a_model_of_another_size_drops_the_notice(tmp_path):
    keys = wire.CurveKeys.generate()
    net = wire.SecureContext(keys)
    endpoint = f"tcp://127.0.0.1:{_port()}"
    board = str(tmp_path / "b")
    try:
        pub = WeightPublisher(net, endpoint, "learner-0", board)
        sub = WeightSubscriber(net, endpoint, QNetwork((4,), 2, (8,)), board)
        time.sleep(0.3)
        pub.publish(1, QNetwork((4,), 2, (16,)))
        deadline = time.time() + 10
        while sub.dropped == 0 and time.time() < deadline:
            sub.poll()
            time.sleep(0.001)
        assert sub.dropped == 1 and sub.version == -1
        assert flat_parameters(sub.model).numel() != flat_parameters(QNetwork((4,), 2, (16,))).numel()
        pub.close()
    finally:
        net.close()


def test_publisher_makes_only_the_forms_someone_subscribes_to(tmp_path):
    keys = wire.CurveKeys.generate()
    net = wire.SecureContext(keys)
    endpoint = f"tcp://127.0.0.1:{_port()}"
    try:
        pub = WeightPublisher(net, endpoint, "learner-0", str(tmp_path / "b"))
        assert not pub.wanted(FULL) and not pub.wanted(NOTICE)
        model = QNetwork((4,), 2, (8,))
        pub.publish(1, model)
        assert pub.board is None  # nobody reads it: not even created
        local = WeightSubscriber(net, endpoint, QNetwork((4,), 2, (8,)), str(tmp_path / "b"))
        deadline = time.time() + 10
        while not pub.wanted(NOTICE) and time.time() < deadline:
            time.sleep(0.01)
        assert pub.wanted(NOTICE) and not pub.wanted(FULL)  # every subscriber reads the board: no vector is sent
        assert pub.joined() and not pub.joined()  # one newcomer, reported once
        second = WeightSubscriber(net, endpoint, QNetwork((4,), 2, (8,)), str(tmp_path / "b"))
        deadline = time.time() + 10
        while not pub.joined() and time.time() < deadline:  # the same prefix again is still a newcomer
            time.sleep(0.01)
        assert time.time() < deadline
        second.sock.close(linger=0)
        local.sock.close(linger=0)
        deadline = time.time() + 10
        while pub.wanted(NOTICE) and time.time() < deadline:
            time.sleep(0.01)
        assert not pub.wanted(NOTICE)  # the last board reader left
        pub.close()
    finally:
        net.close()
