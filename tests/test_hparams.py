"""TensorBoard's hyperparameters of a run (HParams tab, text table): only the job's settings that apply to it."""

from __future__ import annotations

from conftest import small_job
from jobfiles import shipped_job
from rlctl.job.applicable import applicable_settings, unused_sections
from rlctl.job.load import load_job
from rlctl.metrics import MetricsHub
from rlctl.rundir import RunDir
from rlctl.supervise.metrics_sink import MetricsSink


def _hparams_of(run_dir) -> tuple[dict, str]:
    """The session's hparams and the hyperparameters text, read back with tensorboard's reader and protos."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    data = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(data).session_start_info
    text = acc.Tensors("hyperparameters")[0].tensor_proto.string_val[0].decode()
    return dict(start.hparams), text


def test_hparams_of_a_cartpole_job_carry_only_the_sections_it_uses(tmp_path):
    spec = load_job(small_job(tmp_path))  # CartPole, Ape-X with replay, local inference, an evaluator, no Slurm
    rd = RunDir.create(tmp_path / "runs", "tiny")
    sink = MetricsSink(spec, rd.run_id, rd, MetricsHub(), None, own_losses=lambda: (0, 0))
    sink.open_tensorboard(1000.0)
    sink.finish(True, 1000.0)
    hparams, text = _hparams_of(rd.path)
    assert not [k for k in hparams if k.startswith(("env.atari.", "inference.", "cluster.learner_nodes"))], hparams
    assert "env.atari." not in text and "|inference." not in text
    assert {"replay.capacity", "evaluator.episodes", "env.id", "cluster.scheduler", "algorithm.lr"} <= set(hparams)
    # The protobuf holds every number as a double; the text table keeps whole numbers whole.
    assert hparams["replay.capacity"].number_value == 5000 and "|replay.capacity|5000|" in text


def test_sections_apply_by_what_the_job_uses(tmp_path):
    cart = load_job(small_job(tmp_path))
    assert unused_sections(cart) == ["env.atari.", "inference.", "cluster."]
    atari = cart.model_copy(update={"env": cart.env.model_copy(update={"preset": "atari"})})
    assert "env.atari.frame_skip" in applicable_settings(atari)
    no_eval = cart.model_copy(update={"topology": cart.topology.model_copy(update={"evaluator": False})})
    assert "evaluator." in unused_sections(no_eval)
    seed = load_job(shipped_job(tmp_path, "seed-apex"))  # central inference: its [inference] applies
    assert "inference." not in unused_sections(seed) and "inference.deadline_ms" in applicable_settings(seed)
    ppo = load_job(shipped_job(tmp_path, "ppo"))  # on-policy: no replay shards
    assert "replay." in unused_sections(ppo) and not [k for k in applicable_settings(ppo) if k.startswith("replay.")]
