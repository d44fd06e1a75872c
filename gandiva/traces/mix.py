"""Model mixes: which models a trace without model names is given, drawn per job, seeded."""

from __future__ import annotations

import random
from bisect import bisect
from itertools import accumulate
from typing import TypedDict

from gandiva.spec import JobSpec
from gandiva.traces._parse import evolve

GAVEL_JOB_TYPES = (
    "ResNet-18 (batch size 16)",
    "ResNet-18 (batch size 32)",
    "ResNet-18 (batch size 64)",
    "ResNet-18 (batch size 128)",
    "ResNet-18 (batch size 256)",
    "ResNet-50 (batch size 16)",
    "ResNet-50 (batch size 32)",
    "ResNet-50 (batch size 64)",
    "ResNet-50 (batch size 128)",
    "Transformer (batch size 16)",
    "Transformer (batch size 32)",
    "Transformer (batch size 64)",
    "Transformer (batch size 128)",
    "Transformer (batch size 256)",
    "LM (batch size 5)",
    "LM (batch size 10)",
    "LM (batch size 20)",
    "LM (batch size 40)",
    "LM (batch size 80)",
    "Recommendation (batch size 512)",
    "Recommendation (batch size 1024)",
    "Recommendation (batch size 2048)",
    "Recommendation (batch size 4096)",
    "Recommendation (batch size 8192)",
    "A3C",
    "CycleGAN",
)
"""The 26 job types of Gavel's throughput tables and traces."""


class Mix(TypedDict):
    weights: dict[str, float]
    """Model class -> share of jobs."""
    models: dict[str, list[str]]
    """Model class -> its models, equally likely within the class."""


MIXES: dict[str, Mix] = {
    # The Gandiva paper's mix: CV 10%, NLP 60%, speech 30%; keys are the perf model's.
    "paper": {
        "weights": {"cv": 0.1, "nlp": 0.6, "speech": 0.3},
        "models": {
            "cv": ["resnet50", "resnext50", "vgg16", "superresolution", "vae"],
            "nlp": ["lstm", "rhn", "scrnn", "milstm"],
            "speech": ["deepspeech", "wavenet"],
        },
    },
    # Uniform over Gavel's job types, as Gavel draws them for its Philly-derived traces.
    "gavel": {"weights": {"all": 1.0}, "models": {"all": list(GAVEL_JOB_TYPES)}},
    # Uniform over the five models the Chronus traces use.
    "chronus": {
        "weights": {"all": 1.0},
        "models": {"all": ["alexnet", "vgg16", "resnet101", "mobilenet_v2", "inception_v3"]},
    },
}


def assign_models(jobs: list[JobSpec], mix: str, seed: int) -> list[JobSpec]:
    """Give every job with an empty model one drawn from ``mix``; jobs with a model keep it.

    Draws follow job order from ``random.Random(seed)``, so a trace and seed fix the models.
    """
    models, cum_weights = _flatten(mix)
    total = cum_weights[-1]
    draw = random.Random(seed).random
    return [
        job if job.model else evolve(job, "model", models[bisect(cum_weights, draw() * total)])
        for job in jobs
    ]


def check_mix(mix: str) -> None:
    if mix not in MIXES:
        raise ValueError(f"unknown model mix {mix!r}; known mixes: {', '.join(MIXES)}")


def _flatten(mix: str) -> tuple[list[str], list[float]]:
    """Per-model cumulative weights: a class's share split evenly over its models."""
    check_mix(mix)
    spec = MIXES[mix]
    models: list[str] = []
    weights: list[float] = []
    for kind, share in spec["weights"].items():
        names = spec["models"][kind]
        models += names
        weights += [share / len(names)] * len(names)
    return models, list(accumulate(weights))
