"""An engine's launch command is one of its traits (planner/serving/engines.py ``launch``), not a table keyed by
its name in launch.py: a toy engine registered here, in the test only, is launched by its own builder, and one
without a builder is a SpecError naming ``engine`` (a 422 over HTTP), never a KeyError."""

from __future__ import annotations

import dataclasses
import shlex
from types import SimpleNamespace

import pytest

from planner._errors import SpecError
from planner.serving import engines
from planner.serving.engines import ENGINES, SGLANG, TRTLLM, VLLM
from planner.serving.launch import (
    SGLANG_DYNAMO,
    VLLM_DYNAMO,
    Command,
    dynamo_deployment,
    launch_commands,
    render,
    sglang_command,
    trtllm_command,
    vllm_command,
)
from planner.serving.spec import Pool, ServeOptions

PREFILL = Pool("prefill", workers=1, tp=1, dp=16, ep=16, attention_dp=True)
DECODE = Pool("decode", workers=2, tp=8, pp=2)


def _toy_command(model, traits, pool, options, disagg, per_node, num_experts) -> Command:
    argv = ["toy-serve", model, "--gpus", str(pool.worker_gpus), "--batch", str(traits.max_batch_tokens)]
    return Command(tuple(argv + (["--role", pool.role] if disagg else [])), per_node=(("--rank", "NODE_RANK", ""),))


@pytest.fixture
def toy():
    traits = engines.register(dataclasses.replace(VLLM, name="toy", label="Toy", max_batch_tokens=123,
                                                  launch=_toy_command))  # fmt: skip
    yield traits
    del ENGINES["toy"]


def test_each_engine_carries_its_own_builder():
    assert (VLLM.launch, SGLANG.launch, TRTLLM.launch) == (vllm_command, sglang_command, trtllm_command)
    assert all(t.launch is not None for t in ENGINES.values())


def test_a_toy_engine_is_launched_by_its_own_builder(toy):
    assert engines.engine("toy") is toy
    launches = launch_commands("m/x", toy, (PREFILL, DECODE), ServeOptions(), devices_per_node=8)
    # one line per worker: the prefill worker (16 GPUs over 2 nodes) and two decode workers (16 GPUs each)
    assert [(x.role, x.worker, x.nodes) for x in launches] == [("prefill", 0, 2), ("decode", 0, 2), ("decode", 1, 2)]
    assert launches[0].command.argv == ("toy-serve", "m/x", "--gpus", "16", "--batch", "123", "--role", "prefill")
    script = render(launches, toy.label)
    assert script.splitlines()[1].startswith("# Toy launch commands")
    body = [line for line in script.splitlines() if line.startswith("toy-serve")]
    assert body[2] == shlex.join(launches[2].command.argv) + ' --rank "${NODE_RANK}" &'
    # no other engine's launcher anywhere in it
    assert not any(word in script for word in ("vllm", "sglang", "trtllm"))


def test_an_engine_without_a_builder_is_a_spec_error_on_engine():
    mute = dataclasses.replace(SGLANG, name="mute", label="Mute", launch=None)
    with pytest.raises(SpecError) as err:
        launch_commands("m", mute, (DECODE,), ServeOptions(), devices_per_node=8)
    assert err.value.field == "engine"
    assert "'mute' (Mute) has no launch command builder" in str(err.value)


def test_dynamo_worker_is_a_trait_and_its_args_are_the_engines_own():
    """How Dynamo runs an engine's worker is the engine's ``dynamo`` trait; an engine without one (TensorRT-LLM
    here: its Dynamo worker reads a --extra-engine-args file the manifest does not carry) is a SpecError on
    ``engine``, never a lookup by name."""
    assert (VLLM.dynamo, SGLANG.dynamo, TRTLLM.dynamo) == (VLLM_DYNAMO, SGLANG_DYNAMO, None)
    model = SimpleNamespace(name="m/x", moe=None)
    cluster = SimpleNamespace(devices_per_node=8)
    with pytest.raises(SpecError) as err:
        dynamo_deployment(model, cluster, TRTLLM, (PREFILL, DECODE), ServeOptions(), "")
    assert err.value.field == "engine" and "'trtllm' (TensorRT-LLM) has no Dynamo worker" in str(err.value)
    # a toy worker stem and module: the manifest takes both from the trait; DECODE is tp 8 x pp 2 = 16 GPUs
    toy = dataclasses.replace(VLLM, name="toy2", dynamo=dataclasses.replace(VLLM_DYNAMO, module="toy.mod",
                                                                              service="Toy"))  # fmt: skip
    services = dynamo_deployment(model, cluster, toy, (PREFILL, DECODE), ServeOptions(), "")["spec"]["services"]
    assert list(services) == ["Frontend", "ToyPrefillWorker", "ToyDecodeWorker"]
    decode = services["ToyDecodeWorker"]
    assert decode["replicas"] == 2 and decode["multinode"] == {"nodeCount": 2}
    assert decode["resources"] == {"limits": {"gpu": "8"}}
    main = decode["extraPodSpec"]["mainContainer"]
    assert main["command"] == ["python3", "-m", "toy.mod"]
    assert main["args"][:6] == ["--model", "m/x", "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2"]
