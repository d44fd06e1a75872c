"""Job specs as users write them: YAML or JSON, every problem named with its field."""

import pytest

from gandiva.server.jobspec import JobRequest, SpecError, parse


def test_yaml_spec_with_every_field():
    spec = parse("""
name: resnet-lr0.1
command: python train.py --lr 0.1 --note "two words"
workdir: runs/a
env: {SEED: "3"}
gpus: 2
elastic: {min: 1, max: 4}
priority: 5
model: resnet50
time_limit: 90m
""")
    assert spec.command == ["python", "train.py", "--lr", "0.1", "--note", "two words"]
    assert spec.workdir == "runs/a" and spec.env == {"SEED": "3"}
    assert (spec.gpus, spec.elastic.min, spec.elastic.max, spec.priority) == (2, 1, 4, 5)
    assert spec.time_limit == 5400.0


def test_json_spec_and_defaults():
    spec = parse('{"name": "x", "command": ["python", "t.py"]}')
    assert spec == JobRequest(name="x", command=["python", "t.py"])
    assert (spec.gpus, spec.workdir, spec.priority, spec.time_limit) == (1, ".", 0, None)


@pytest.mark.parametrize("text, field, words", [
    ("name: x\ncommand: []", "command", "at least 1"),
    ("command: [a]", "name", "Field required"),
    ("name: '../x'\ncommand: [a]", "name", "letters, digits"),
    ("name: x\ncommand: [a]\ngpus: 0", "gpus", "greater than or equal to 1"),
    ("name: x\ncommand: [a]\nworkdir: /etc", "workdir", "relative, without '..'"),
    ("name: x\ncommand: [a]\nworkdir: a/../../b", "workdir", "relative, without '..'"),
    ("name: x\ncommand: [a]\nenv: {RANK: '3'}", "env", "set by gandiva"),
    ("name: x\ncommand: [a]\nenv: {'A-B': '3'}", "env", "not a valid environment"),
    ("name: x\ncommand: [a]\ntime_limit: soon", "time_limit", "HH:MM:SS"),
    ("name: x\ncommand: [a]\nelastic: {min: 3, max: 2}\ngpus: 2", "elastic", "more than max"),
    ("name: x\ncommand: [a]\nelastic: {min: 1, max: 2}\ngpus: 4", "(spec)", "within elastic"),
    ("name: x\ncommand: [a]\ngpu: 2", "gpu", "Extra inputs are not permitted"),
    ("name: x\ncommand: 'a \"unclosed'", "command", "split it like a shell"),
    ("- just\n- a list", "(spec)", "mapping of fields"),
    ("name: [unclosed", "not YAML", "not YAML"),
])
def test_bad_specs_name_the_field_and_the_fix(text, field, words):
    with pytest.raises(SpecError) as err:
        parse(text, "job.yaml")
    message = str(err.value)
    assert message.startswith("job.yaml: invalid job spec")
    assert any(p.startswith(field) or field in p for p in err.value.problems), message
    assert words in message
