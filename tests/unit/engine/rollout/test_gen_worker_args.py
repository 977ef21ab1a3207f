"""GenerationWorkerArgs: the generation worker's settings, each named once; nothing unknown slips through."""

import pytest

from engine.rollout.gen_worker_args import GenerationWorkerArgs


def test_the_defaults_leave_threads_to_torch_and_inject_no_fault():
    args = GenerationWorkerArgs(backend={"kind": "hf", "model_dir": "m"}, run_id="r")
    assert (args.threads, args.kill_after_requests, args.store) == (None, None, None)


def test_an_unknown_setting_is_refused_by_name():
    with pytest.raises(ValueError, match=r"(?s)max_batch\n.*Extra inputs are not permitted"):
        GenerationWorkerArgs(backend={"kind": "hf"}, run_id="r", max_batch=8)  # belongs in backend


def test_a_fault_after_zero_requests_is_refused():
    with pytest.raises(ValueError, match=r"(?s)kill_after_requests\n.*greater than or equal to 1"):
        GenerationWorkerArgs(backend={"kind": "hf"}, run_id="r", kill_after_requests=0)
