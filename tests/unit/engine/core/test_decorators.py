"""What each dispatch decorator declares, where an `hw_mapping` call's tag comes from, and what a
serverless endpoint of a `@register_serverless` method runs."""

from types import SimpleNamespace

import pytest

from engine.core.decorators import DispatchSpec, dispatch_spec, hw_mapping, register, register_serverless
from engine.core.worker import Role, Worker, serverless_body
from engine.rollout.gen_worker import GenerationWorker


def test_decorators_attach_their_spec_and_leave_the_function_callable():
    @hw_mapping(tag_name="profile")
    def gen(request):
        return request

    @register
    def info():
        return 1

    @register_serverless(endpoint="judge")
    def judge(a, b):
        return a + b

    assert dispatch_spec(gen) == DispatchSpec("hw", tag_name="profile") and gen(3) == 3
    assert dispatch_spec(info) == DispatchSpec("all") and info() == 1
    assert dispatch_spec(judge) == DispatchSpec("serverless", endpoint="judge") and judge(1, 2) == 3
    assert dispatch_spec(lambda: None) is None


def test_an_hw_call_is_tagged_by_its_keyword_else_by_its_request_field():
    spec = DispatchSpec("hw", tag_name="profile")
    request = SimpleNamespace(profile="decode-heavy")
    assert spec.tag((request,), {}) == "decode-heavy"
    assert spec.tag((request,), {"profile": "prefill-heavy"}) == "prefill-heavy"  # the keyword wins
    with pytest.raises(TypeError, match="needs the keyword argument or request field 'profile'"):
        spec.tag((SimpleNamespace(),), {})
    with pytest.raises(TypeError, match="request field 'profile'"):
        spec.tag((), {})


def test_generation_is_declared_hw_mapped_by_the_request_profile():
    """The LLMProxy routes `generate` by the tag this declares (engine/experiment.py asks the Cluster)."""
    assert dispatch_spec(GenerationWorker.generate) == DispatchSpec("hw", tag_name="profile")


class _Scorer(Worker):
    role = Role.REWARD

    @register_serverless(endpoint="judge")
    def judge(self, payload: dict) -> float:
        return float(payload["x"]) * self.config["scale"]

    def plain(self) -> None:
        return None


def test_a_serverless_endpoint_runs_the_declared_method_of_a_worker_built_once_per_replica():
    body = serverless_body(_Scorer, "judge", "judge-0", "cpu", "cpu", {"scale": 2.0})
    assert body({"x": 3}) == 6.0 and body.__self__.pool == "cpu" and body.__self__.name == "judge-0"
    with pytest.raises(ValueError, match=r"_Scorer\.plain is not declared @register_serverless"):
        serverless_body(_Scorer, "plain", "p", "cpu", "cpu", {})
