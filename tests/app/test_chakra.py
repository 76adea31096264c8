"""The Chakra execution trace (issue 23 item 6) decoded by protobuf itself, with descriptors built from
MLCommons Chakra's own schema (tests/reference/chakra/et_def.proto, verbatim): our hand-written encoding is
read field by field as ASTRA-sim's feeder reads it (src/feeder/et_feeder_node.cpp)."""

from __future__ import annotations

import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal.decoder import _DecodeVarint32

from app.cli import main
from app.convert import plan_inputs
from app.schemas.plan import PlanRequest
from app.settings import Settings
from planner import build_plan
from planner.exports import chakra_omitted, chakra_trace

from .conftest import LLAMA70B

PROTO = Path(__file__).resolve().parents[1] / "reference" / "chakra" / "et_def.proto"
SCALARS = {
    name: getattr(descriptor_pb2.FieldDescriptorProto, "TYPE_" + name.upper())
    for name in ("double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32",
                 "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes")
}  # fmt: skip


@cache
def chakra_classes() -> dict:
    """Message classes from et_def.proto: its messages, enums, oneofs and (repeated) fields, read with a small
    parser of the proto3 subset the file uses (no imports, options or nesting)."""
    text = re.sub(r"//[^\n]*", "", PROTO.read_text())
    package = re.search(r"package\s+([\w.]+);", text).group(1)
    fd = descriptor_pb2.FileDescriptorProto(name="et_def.proto", package=package, syntax="proto3")
    enums = set()
    for name, body in re.findall(r"enum\s+(\w+)\s*\{([^}]*)\}", text):
        enum = fd.enum_type.add(name=name)
        enums.add(name)
        for value, number in re.findall(r"(\w+)\s*=\s*(\d+);", body):
            enum.value.add(name=value, number=int(number))
    for name, body in re.findall(r"message\s+(\w+)\s*\{((?:[^{}]|\{[^{}]*\})*)\}", text):
        msg = fd.message_type.add(name=name)
        oneofs = {m.start(): (m.group(1), m.end()) for m in re.finditer(r"oneof\s+(\w+)\s*\{[^}]*\}", body)}
        for oneof, _ in oneofs.values():
            msg.oneof_decl.add(name=oneof)
        for m in re.finditer(r"(repeated\s+)?([\w.]+)\s+(\w+)\s*=\s*(\d+);", body):
            kind, field_name, number = m.group(2), m.group(3), int(m.group(4))
            field = msg.field.add(name=field_name, number=number)
            field.label = field.LABEL_REPEATED if m.group(1) else field.LABEL_OPTIONAL
            if kind in SCALARS:
                field.type = SCALARS[kind]
            else:
                field.type = field.TYPE_ENUM if kind in enums else field.TYPE_MESSAGE
                field.type_name = f".{package}.{kind}"
            inside = [i for i, (start, (_, end)) in enumerate(oneofs.items()) if start < m.start() < end]
            if inside:
                field.oneof_index = inside[0]
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{m.name}"))
            for m in fd.message_type}  # fmt: skip


def read_trace(data: bytes) -> tuple:
    """A length-delimited stream (Chakra protolib.py decodeMessage): GlobalMetadata, then Nodes."""
    classes, pos, messages = chakra_classes(), 0, []
    while pos < len(data):
        size, pos = _DecodeVarint32(data, pos)
        kind = classes["GlobalMetadata"] if not messages else classes["Node"]
        message = kind()
        message.ParseFromString(data[pos : pos + size])
        messages.append(message)
        pos += size
    assert pos == len(data)
    return messages[0], messages[1:]


def attrs(node) -> dict:
    return {a.name: getattr(a, a.WhichOneof("value")) for a in node.attr}


def typed(request: dict):
    return build_plan(*plan_inputs(PlanRequest.model_validate(request), Settings()))


def test_the_parser_reads_chakras_schema():
    classes = chakra_classes()
    node = classes["Node"].DESCRIPTOR
    wanted = {"id": 1, "name": 2, "type": 3, "data_deps": 5, "duration_micros": 7, "attr": 10}
    assert {f.name: f.number for f in node.fields}.items() >= wanted.items()
    attr = classes["AttributeProto"].DESCRIPTOR
    assert attr.fields_by_name["int64_val"].number == 9 and attr.fields_by_name["bool_val"].number == 27
    assert attr.fields_by_name["int64_val"].containing_oneof.name == "value"
    assert node.fields_by_name["type"].enum_type.values_by_name["COMM_COLL_NODE"].number == 7


@pytest.mark.parametrize(
    "request_",
    [LLAMA70B, {**LLAMA70B, "model": {"preset": "mixtral-8x7b"},
                "parallel": {"tp": 2, "pp": 8, "dp": 32, "ep": 8, "zero_stage": 1, "sequence_parallel": True}}],
    ids=["llama70b", "mixtral-ep8"],
)  # fmt: skip
def test_chakra_trace_decodes_and_holds_the_stages_calls(request_):
    """Every collective instance of the stage is one COMM_COLL_NODE with its comm_type (et_def.proto
    CollectiveCommType), message bytes and group; 2 compute nodes per micro-batch with the stage's forward and
    backward time in us; a chain of data dependencies; point-to-point calls named as left out."""
    plan = typed(request_)
    enum = chakra_classes()["Node"].DESCRIPTOR.fields_by_name["type"].enum_type
    comm_types = chakra_classes()["Node"].DESCRIPTOR.file.enum_types_by_name["CollectiveCommType"]
    names = {"allreduce": "ALL_REDUCE", "allgather": "ALL_GATHER", "reducescatter": "REDUCE_SCATTER",
             "alltoall": "ALL_TO_ALL", "broadcast": "BROADCAST", "reduce": "REDUCE"}  # fmt: skip
    for stage in (0, plan.num_stages - 1):
        meta, nodes = read_trace(chakra_trace(plan, stage))
        assert attrs(meta)["schema"] == "1.0.2-chakra.1.0.0"
        assert [n.id for n in nodes] == list(range(len(nodes)))
        assert all(list(n.data_deps) == ([n.id - 1] if n.id else []) for n in nodes)
        comp = [n for n in nodes if n.type == enum.values_by_name["COMP_NODE"].number]
        coll = [n for n in nodes if n.type == enum.values_by_name["COMM_COLL_NODE"].number]
        assert len(comp) + len(coll) == len(nodes) and len(comp) == 2 * plan.num_microbatches
        step = plan.step.stages[stage].compute
        assert comp[0].duration_micros == round(step.forward.total_s * 1e6) > 0
        assert comp[1].duration_micros == round(step.backward.total_s * 1e6) > 0
        got = Counter((n.name, attrs(n)["comm_type"], attrs(n)["comm_size"], attrs(n)["pg_name"]) for n in coll)
        omitted = set(chakra_omitted(plan, stage))
        expected = Counter()
        for pc in plan.calls:
            if stage in pc.call.stages and pc.call.name not in omitted:
                kind = comm_types.values_by_name[names[pc.call.op.value]].number
                key = (pc.call.name, kind, pc.call.message_bytes, pc.call.parallelism)
                expected[key] += pc.call.calls_per_iteration
        assert got == expected
        assert all(attrs(n)["is_cpu_op"] is False for n in nodes)
        assert omitted and all(name.startswith(("pp.", "cp.")) for name in omitted)


def test_chakra_over_http_and_the_cli(api, tmp_path, capsysbinary):
    r = api.post("/v1/plan/export/chakra?stage=2", json=LLAMA70B)
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    assert "commplan-chakra-stage2-0.et" in r.headers["content-disposition"]
    assert "pp.activation" in r.headers["x-commplan-omitted"]
    _meta, nodes = read_trace(r.content)
    assert r.content == chakra_trace(typed(LLAMA70B), 2) and len(nodes) > 100
    assert api.post("/v1/plan/export/chakra?stage=4", json=LLAMA70B).status_code == 422
    path = tmp_path / "req.json"
    path.write_text(__import__("json").dumps(LLAMA70B))
    assert main(["plan", str(path), "--format", "chakra", "--stage", "2"]) == 0
    assert capsysbinary.readouterr().out == r.content
