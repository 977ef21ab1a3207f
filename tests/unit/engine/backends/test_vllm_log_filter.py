import logging

import engine.backends.vllm  # noqa: F401  (installs the filter)


def test_the_rotary_cache_reload_warning_is_dropped_and_nothing_else(caplog):
    logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    propagate, logger.propagate = logger.propagate, True  # caplog listens at the root logger
    try:
        with caplog.at_level(logging.WARNING):
            logger.warning("%s: Failed to load weights", "RotaryEmbedding")
            logger.warning("%s: Failed to load weights", "QKVParallelLinear")
    finally:
        logger.propagate = propagate
    assert [r.getMessage() for r in caplog.records] == ["QKVParallelLinear: Failed to load weights"]
