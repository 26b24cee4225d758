"""TensorBoard's hyperparameters of a run (HParams tab, text table): only the job's settings that apply to it."""

from __future__ import annotations

from conftest import small_job
from rlctl import metric_names as M
from jobfiles import shipped_job
from rlctl.job.applicable import applicable_settings, unused_sections
from rlctl.job.load import load_job
from rlctl.metrics import MetricsHub
from rlctl.role_names import Role
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


def _experiment_and_metrics(run_dir):
    """The run's HParams experiment (its columns: name -> differs), its session's hparams and each scalar's last
    value (the figures the HParams tab shows beside them)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    content = {tag: plugin_data_pb2.HParamsPluginData.FromString(data)
               for tag, data in acc.PluginTagToContent("hparams").items()}
    experiment = content["_hparams_/experiment"].experiment
    columns = {h.name: h.differs for h in experiment.hparam_infos}
    metrics = [m.name.tag for m in experiment.metric_infos]
    last = {tag: acc.Scalars(tag)[-1].value for tag in acc.Tags()["scalars"]}
    return columns, dict(content["_hparams_/session_start_info"].session_start_info.hparams), metrics, last


def _feed(sink: MetricsSink, returns_per_point: list[list[float]]) -> None:
    steps = 0
    for returns in returns_per_point:
        steps += 500
        sink.hub.on_heartbeat("collector-0", Role.COLLECTOR, {M.EPISODE_RETURNS: returns, "env_steps": steps})
        sink.write_point()


def test_a_sweeps_trials_show_in_one_hparams_table_their_parameters_and_best_and_final_return(tmp_path):
    from rlctl.job.sweep_spec import load_sweep
    from rlctl.launch.sweep import create_sweep

    shipped_job(tmp_path, "ppo", file_name="base.toml")
    f = tmp_path / "sweep.toml"
    f.write_text('[sweep]\nbase = "base.toml"\nseeds = [1, 2]\n\n[sweep.params]\n"algorithm.lr" = [1e-3, 4e-3]\n')
    sweep = create_sweep(load_sweep(f), tmp_path / "runs")
    for i, trial in enumerate(sweep.trials()):
        rd = sweep.trial_dir(trial["id"])
        sink = MetricsSink(load_job(rd.job_toml), trial["id"], rd, MetricsHub(), None, own_losses=lambda: (0, 0))
        sink.open_tensorboard(1000.0)
        _feed(sink, [[10.0 + i, 30.0 + i], [0.0, 0.0]])  # a mean of 20 + i, then of 10 + i/2
        sink.finish(True, 1000.0)
    for i, trial in enumerate(sweep.trials()):
        columns, hparams, metrics, last = _experiment_and_metrics(sweep.trial_dir(trial["id"]).path)
        # The same columns in every trial's experiment (TensorBoard shows one of them for the sweep's folder):
        # the sweep's parameters, each marked as differing.
        assert columns == {"sweep.trial": True, "algorithm.lr": True, "job.seed": True}, columns
        assert hparams["sweep.trial"].string_value == trial["id"]
        assert hparams["algorithm.lr"].number_value == trial["values"]["algorithm.lr"]
        assert hparams["job.seed"].number_value == trial["seed"] and "env.id" in hparams  # the job's keys too
        assert {M.EPISODE_RETURN_MEAN, M.EPISODE_RETURN_BEST} <= set(metrics)
        assert last[M.EPISODE_RETURN_BEST] == 20 + i and last[M.EPISODE_RETURN_MEAN] == 10 + i / 2
    # A run of its own keeps every applicable key as a column (none marked as differing).
    rd = RunDir.create(tmp_path / "runs", "alone")
    sink = MetricsSink(load_job(small_job(tmp_path)), rd.run_id, rd, MetricsHub(), None, own_losses=lambda: (0, 0))
    sink.open_tensorboard(1000.0)
    sink.finish(True, 1000.0)
    columns = _experiment_and_metrics(rd.path)[0]
    assert "sweep.trial" not in columns and "replay.capacity" in columns and not any(columns.values())


def test_the_best_return_carries_over_a_resume(tmp_path):
    rd = RunDir.create(tmp_path / "runs", "tiny")
    resumed = {"env_steps": 1000, "episodes": 4, "best_return": 50.0}
    sink = MetricsSink(load_job(small_job(tmp_path)), rd.run_id, rd, MetricsHub(), resumed, own_losses=lambda: (0, 0))
    sink.open_tensorboard(1000.0)
    _feed(sink, [[20.0]])
    assert sink.figures()[M.EPISODE_RETURN_BEST] == 50.0
    _feed(sink, [[200.0]])
    assert sink.figures()[M.EPISODE_RETURN_BEST] == 110.0  # the mean of 20 and 200
    sink.finish(True, 1000.0)
