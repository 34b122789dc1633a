"""Stage runtime: compile a stage's OpenVINO graph once, run one KV state per session."""

from agent.runtime.pipeline import LocalPipeline, PipelineSession
from agent.runtime.session import StageSession
from agent.runtime.stage import CompiledStage, RuntimeConfig, choose_device

__all__ = ["CompiledStage", "LocalPipeline", "PipelineSession", "RuntimeConfig", "StageSession", "choose_device"]
