"""vLLM sleeps once per rollout phase (GPU): awake through every turn of a step, asleep while the trainer
runs, woken by the next generate. The sleep mode itself needs a GPU, so vLLM's `LLM` is replaced by a
recorder here: this checks the engine's sequencing, not vLLM."""

import pytest

from oxrl.rollout.base import SamplingParams
from oxrl.rollout.build import VLLM_INSTALL_HINT

pytest.importorskip("vllm", reason=f"vLLM is not installed: {VLLM_INSTALL_HINT}")


class RecordingLLM:
    def __init__(self):
        self.calls: list[str] = []

    def generate(self, prompts, sampling, use_tqdm=False):
        self.calls.append("generate")
        return []

    def sleep(self, level):
        self.calls.append(f"sleep(level={level})")

    def wake_up(self):
        self.calls.append("wake_up")


def engine_with(llm, can_sleep: bool):
    from oxrl.rollout.vllm_engine import VLLMEngine

    engine = object.__new__(VLLMEngine)  # no vllm.LLM: only the phase logic is under test
    engine.llm, engine.can_sleep, engine._asleep, engine.eos_ids, engine.never_sampled = llm, can_sleep, False, {2}, []
    return engine


def test_one_sleep_per_rollout_phase_and_the_next_generate_wakes():
    llm = RecordingLLM()
    engine = engine_with(llm, can_sleep=True)
    params = SamplingParams(n=1, max_new_tokens=4)
    engine.generate([[1, 5]], params)  # turn 1
    engine.generate([[1, 5, 6]], params)  # turn 2 of the same rollout phase: no sleep in between
    engine.offload()
    engine.offload()  # already asleep: nothing more
    engine.generate([[1, 7]], params)
    assert llm.calls == ["generate", "generate", "sleep(level=1)", "wake_up", "generate"]


def test_without_sleep_mode_offload_does_nothing():
    llm = RecordingLLM()
    engine = engine_with(llm, can_sleep=False)
    engine.generate([[1, 5]], SamplingParams(n=1, max_new_tokens=4))
    engine.offload()
    assert llm.calls == ["generate"]
