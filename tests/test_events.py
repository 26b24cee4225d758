"""rlctl.events in this process: every event's line parses back to its fields, and a log is hostile input (a line
is an event only when it is exactly one; everything else is skipped, never an error)."""

from __future__ import annotations

import json
import time

import pytest

from rlctl import events

EXAMPLES = {
    "remote_session": {"host": "cpu-7"},
    "first_env_step": {"process": "collector-0", "version": 3},
    "first_batch_sent": {"process": "collector-1", "transitions": 512},
    "first_update": {"process": "learner-1", "update": 1201},
    "resumed": {"process": "learner-0", "path": "/runs/a b/checkpoints/latest.pt", "update": 1200, "version": 1200,
                "restart": 1, "lr": 0.004},
    "snapshot_loaded": {"process": "replay-0", "path": "/runs/x/replay-0.npz", "size": 5000, "inserted": 7000,
                        "seconds": 0.25},
    "snapshot_written": {"process": "replay-0", "size": 5000, "inserted": 7000, "seconds": 0.0},
    "exit": {"reason": events.EXIT_SUPERVISOR_GONE, "detail": "supervisor (pid 12) is gone: stopping"},
}


def stamp(ts: float) -> str:
    """The supervisor's stamp for a log line (rlctl.supervise.loop.LogPump)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts)) + f".{int(ts % 1 * 1000):03d}"


def test_every_event_has_an_example():
    assert EXAMPLES.keys() == events.EVENTS.keys()


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_an_event_line_parses_back_stamped_or_not(name):
    text = events.line(name, **EXAMPLES[name])
    assert text.startswith(events.PREFIX + name + " ") and "\n" not in text
    bare = events.parse(text)
    assert bare is not None and bare.name == name and bare.ts is None and dict(bare.fields) == EXAMPLES[name]
    stamped = events.parse(f"{stamp(1_800_000_000.25)} {text}\n")
    assert stamped.ts == pytest.approx(1_800_000_000.25, abs=0.002) and dict(stamped.fields) == EXAMPLES[name]
    key = next(iter(EXAMPLES[name]))
    assert stamped[key] == EXAMPLES[name][key]


def test_emit_prints_the_line_people_read(capsys):
    events.emit("first_update", process="learner-0", update=7)
    assert capsys.readouterr().out == 'rlctl.event first_update {"process": "learner-0", "update": 7}\n'


def test_a_line_that_no_reader_would_accept_is_refused_where_it_is_written():
    with pytest.raises(ValueError):
        events.line("first_update", process="learner-0")  # a field missing
    with pytest.raises(ValueError):
        events.line("first_update", process="learner-0", update=1, extra=2)
    with pytest.raises(ValueError):
        events.line("first_update", process="learner-0", update=True)  # a bool is no count
    with pytest.raises(ValueError):
        events.line("first_updates", process="learner-0", update=1)
    with pytest.raises(ValueError):
        events.line("exit", reason="x", detail="y" * events.MAX_LINE)


def test_paths_of_any_characters_stay_on_one_line():
    path = "/runs/ü\n\r\u2028\x00\"'\\/latest.pt"
    text = events.line("resumed", process="learner-0", path=path, update=1, version=1, restart=0, lr=1e-3)
    assert text.isascii() and len(text.splitlines()) == 1
    assert events.parse(text)["path"] == path


HOSTILE = [
    "",
    "rlctl.event",
    "rlctl.event ",
    "rlctl.event first_update",
    "rlctl.event first_update ",
    "rlctl.event first_update {",
    'rlctl.event first_update {"process": "learner-0", "update": 1',
    'rlctl.event first_update ["learner-0", 1]',
    'rlctl.event first_update "learner-0"',
    'rlctl.event first_update null',
    'rlctl.event first_update {"process": "learner-0"}',
    'rlctl.event first_update {"process": "learner-0", "update": 1, "more": 2}',
    'rlctl.event first_update {"process": "learner-0", "update": true}',
    'rlctl.event first_update {"process": "learner-0", "update": 1.0}',
    'rlctl.event first_update {"process": "learner-0", "update": "1"}',
    'rlctl.event first_update {"process": 0, "update": 1}',
    'rlctl.event first_update {"process": null, "update": 1}',
    'rlctl.event first_update {"process": ["learner-0"], "update": 1}',
    'rlctl.event snapshot_written {"process": "replay-0", "size": 1, "inserted": 1, "seconds": NaN}',
    'rlctl.event snapshot_written {"process": "replay-0", "size": 1, "inserted": 1, "seconds": Infinity}',
    'rlctl.event snapshot_written {"process": "replay-0", "size": 1, "inserted": 1, "seconds": 1}',
    'rlctl.event first_updatex {"process": "learner-0", "update": 1}',
    'rlctl.event First_Update {"process": "learner-0", "update": 1}',
    'rlctl.event __class__ {"process": "learner-0", "update": 1}',
    'rlctl.event  first_update {"process": "learner-0", "update": 1}',
    'rlctl.eventfirst_update {"process": "learner-0", "update": 1}',
    'RLCTL.EVENT first_update {"process": "learner-0", "update": 1}',
    'learner-0: rlctl.event first_update {"process": "learner-0", "update": 1}',  # the prefix mid-line
    ' rlctl.event first_update {"process": "learner-0", "update": 1}',
    'rlctl.event first_update {"process": "learner-0", "update": 1} trailing',
    'rlctl.event first_update {"process": "learner-0", "update": 1}{"process": "learner-0", "update": 2}',
    "rlctl.event first_update " + "[" * 100_000 + "]" * 100_000,  # too deep for the parser, and too long
    "rlctl.event first_update " + "[" * 5000 + "]" * 5000,  # under the length bound: only too deep
    'rlctl.event exit {"reason": "x", "detail": "' + "y" * events.MAX_LINE + '"}',
]


@pytest.mark.parametrize("text", HOSTILE, ids=[f"hostile-{i}" for i in range(len(HOSTILE))])
def test_a_line_that_is_not_exactly_an_event_is_none(text):
    assert events.parse(text) is None
    assert events.parse(f"{stamp(time.time())} {text}") is None


def test_read_skips_whatever_is_not_an_event_and_keeps_the_rest_in_order(tmp_path):
    log = tmp_path / "learner-0.log"
    good = [events.line(name, **fields) for name, fields in EXAMPLES.items()]
    lines = []
    for i, text in enumerate(good):
        lines += [f"{stamp(1_800_000_000 + i)} {text}", f"{stamp(1_800_000_000 + i)} {HOSTILE[i % len(HOSTILE)]}",
                  f"{stamp(1_800_000_000 + i)} {HOSTILE[-(i + 1)]}"]
    raw = "\n".join(lines).encode() + b"\n\xff\xfe not utf-8 " + good[0].encode() + b"\n"
    # A carriage return or a line separator inside a line does not split it into an event.
    raw += f"junk\r{good[1]}\njunk\u2028{good[2]}\n".encode()
    log.write_bytes(raw)
    found = events.read(log)
    assert [e.name for e in found] == list(EXAMPLES)
    assert [dict(e.fields) for e in found] == list(EXAMPLES.values())
    assert [e.ts for e in found] == [pytest.approx(1_800_000_000 + i) for i in range(len(EXAMPLES))]


def test_first_finds_by_name_time_and_fields(tmp_path):
    log = tmp_path / "collector-0.log"
    t0 = 1_800_000_000.0
    log.write_text("".join(f"{stamp(t0 + i)} {events.line('first_env_step', process='collector-0', version=i)}\n"
                           for i in range(3))
                   + events.line("first_env_step", process="collector-0", version=9) + "\n")  # no stamp
    assert events.first(log, "first_env_step")["version"] == 0
    assert events.first(log, "first_env_step", after=t0 + 0.5)["version"] == 1
    assert events.first(log, "first_env_step", after=t0 + 2.5) is None  # an unstamped line is after nothing
    assert events.first(log, "first_env_step", version=9).ts is None
    assert events.first(log, "first_env_step", process="collector-1") is None
    assert events.first(log, "first_batch_sent") is None
    assert events.first(tmp_path / "absent.log", "first_env_step") is None
    assert events.read(tmp_path / "absent.log") == []
    with pytest.raises(ValueError):
        events.first(log, "first_env_steps")


def test_event_fields_cannot_be_changed_by_a_reader():
    event = events.parse(events.line("first_update", process="learner-0", update=1))
    with pytest.raises(TypeError):
        event.fields["update"] = 2
    assert json.loads(events.line("first_update", **event.fields).split(" ", 2)[2]) == dict(event.fields)
