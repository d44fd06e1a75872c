"""The traces shipped in ``gandiva/traces/data/``: name -> file, format, job count, provenance.

Each data sub-folder has a PROVENANCE.md (origin repository, commit, licence, field meanings).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Bundled:
    file: str
    """Path under gandiva/traces/data/."""
    format: str
    jobs: int
    """Jobs after the format's drop rules: what load_trace returns without selection."""
    description: str
    source: str


_POLLUX = "petuum/adaptdl osdi21-artifact @c793c70, simulator/{path}, Apache-2.0"
_GAVEL = "stanford-futuredata/gavel @c4fa400, scheduler/traces/{path}, MIT"
_CHRONUS = "S-Lab-System-Group/ChronusArtifact @bc7e15f, code/data/{path}, MIT"

_GAVEL_PHYSICAL = {
    "artifact_evaluation": (15, "Gavel artifact-evaluation trace"),
    "debug": (14, "Gavel debug trace"),
    "debug_v2": (14, "Gavel debug trace, v2"),
    "highmem_test": (8, "Gavel high-memory test trace"),
    "max_min_fairness": (96, "Gavel max-min fairness trace, arrivals over time"),
    "medium_test": (20, "Gavel medium test trace"),
    "minimize_makespan": (100, "Gavel makespan trace, all jobs at t=0"),
    "small_test": (20, "Gavel small test trace"),
}
_GAVEL_PHILLY_VCS = {
    "0e4a51": 1181,
    "103959": 986,
    "11cb48": 2000,
    "23dbec": 9,
    "2869ce": 533,
    "51b7ef": 18,
    "6214e9": 2000,
    "6c71a0": 2000,
    "795a4c": 3,
    "7f04ca": 972,
    "925e2b": 4,
    "b436b2": 2000,
    "e13805": 607,
    "ed69ec": 951,
    "ee9e8c": 2000,
}


def _catalogue() -> dict[str, Bundled]:
    traces = {
        "philly": Bundled(
            "philly/philly.csv",
            "philly",
            82_247,
            "Microsoft Philly job list, Sep-Dec 2017: 82,247 jobs, durations in s, no models",
            "Philly cluster_job_log (Jeon et al., ATC'19) via "
            + _POLLUX.format(path="traces/philly.csv"),
        ),
        "chronus-mix1": Bundled(
            "chronus/trace_job_Philly_MIX1.csv",
            "chronus",
            30_756,
            "Chronus Philly-derived trace, strict + best-effort deadlines: 30,756 jobs with models",
            _CHRONUS.format(path="trace_job_Philly_MIX1.csv"),
        ),
        "chronus-slo": Bundled(
            "chronus/trace_job_Philly_SLO.csv",
            "chronus",
            30_735,
            "Chronus Philly-derived trace, all strict deadlines: 30,735 jobs with models",
            _CHRONUS.format(path="trace_job_Philly_SLO.csv"),
        ),
        "tiresias-60": Bundled(
            "tiresias/60_job.csv",
            "tiresias",
            60,
            "Tiresias 60-job sample: 1-8 GPUs, 2-30 min jobs over 30 min, with models",
            "SymbioticLab/Tiresias @959f9b0, simulator/60_job.csv, Apache-2.0",
        ),
    }
    for stem, (count, what) in _GAVEL_PHYSICAL.items():
        traces[f"gavel-{stem}"] = Bundled(
            f"gavel/physical_cluster/{stem}.trace",
            "gavel",
            count,
            f"{what}: {count} jobs, work in steps",
            _GAVEL.format(path=f"physical_cluster/{stem}.trace"),
        )
    for vc, count in _GAVEL_PHILLY_VCS.items():
        traces[f"gavel-philly-{vc}"] = Bundled(
            f"gavel/msr_philly_per_vc/{vc}.trace",
            "gavel",
            count,
            f"Philly VC {vc} arrivals and sizes, Gavel job types (seed 0): {count:,} jobs",
            _GAVEL.format(path=f"msr_philly_per_vc/seed=0/{vc}.trace"),
        )
    for folder, label, what in (
        ("workloads", "pollux", "tuned requests, 1-48 GPUs"),
        ("workloads-realistic", "pollux-realistic", "mostly 1-GPU requests"),
    ):
        for n in range(1, 9):
            traces[f"{label}-{n}"] = Bundled(
                f"pollux/{folder}/workload-{n}.csv",
                "pollux",
                160,
                f"Pollux 8-hour workload {n}, {what}: 160 jobs, assumed durations",
                _POLLUX.format(path=f"{folder}/workload-{n}.csv"),
            )
    traces["alibaba-2023"] = Bundled(
        "alibaba/openb_pod_list_default.csv",
        "alibaba",
        6_203,
        "Alibaba GPU pods 2023 (fractional GPUs): 6,203 of 8,152 pods ran on GPUs, no models",
        "alibaba/clusterdata @7a6c496, cluster-trace-gpu-v2023/csv/openb_pod_list_default.csv; "
        "cite Weng et al., ATC'23",
    )
    return traces


BUNDLED: dict[str, Bundled] = _catalogue()
