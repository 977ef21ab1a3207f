"""What each dispatch decorator declares, and where an `hw_mapping` call's tag comes from."""

from types import SimpleNamespace

import pytest

from engine.core.decorators import DispatchSpec, dispatch_spec, hw_mapping, register, register_serverless
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
