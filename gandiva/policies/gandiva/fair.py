"""Fair shares by tickets: Gandiva_fair's split stride scheduling (Chaudhary et al., EuroSys
2020) as a slice order.

Each team has a pass: the GPU-seconds its jobs received over its tickets; each user one inside
its team. Among jobs of one priority class (``shares.priority_class``: every member's priority,
or the admins' class above the ceiling), the team with the lowest pass goes first, then within
it the user with the lowest, then that user's jobs by priority, then the slice order's own rule
(levels): a priority orders only its user's own jobs, inside the user's share. A
team (or user) that had no job in the cluster joins at the lowest pass of those that have one
(stride scheduling's rule): time away is not saved up to spend later. A packed GPU charges
each of its jobs half; a suspended job charges nothing. Tickets come from ``Cluster.shares``.

A gang across servers runs only when no job before it took room on any of its servers, so a
pass that is lowest now and then seldom seats it: narrower jobs fill the room first. One that
has waited ``gang_wait`` seconds (since it arrived or was last suspended) reserves its servers:
it goes first among its tier, the longest-waiting first, and takes its turn at the next round
(it is charged for it as any job; decision 0039).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies.gandiva.framework import Cycle, Mechanism, ignores_samples
from gandiva.policies.gandiva.shared import Decision, Shared
from gandiva.shares import Shares, priority_class
from gandiva.state import Cluster, Job, JobStatus

# the user's pass is added at this weight to the team's: one number, ordered team first (a
# user pass of a million GPU-hours moves the sum by under 4 GPU-seconds of team pass)
USER_WEIGHT = 1e-9
# a reserving gang's order: below any pass (a pass is GPU-seconds per ticket, under 1e13 on a
# 10,000-GPU cluster over 30 years), by when it began to wait
RESERVED = -1e15


class FairShare(Mechanism):
    may_change = ignores_samples

    def __init__(self, shared: Shared, gang_wait: float = math.inf) -> None:
        shared.tier, shared.rank = self.tier, self.rank  # priority: a user's own jobs only
        self.s = shared
        self.gang_wait = gang_wait
        self.waits_since: dict[str, float] = {}  # job -> when it arrived or was last suspended
        self.shares = Shares()
        self.used: dict[str, float] = {}  # team -> GPU-seconds received
        self.user_used: dict[str, float] = {}  # user -> GPU-seconds received
        self.jobs: Counter[str] = Counter()  # team -> its jobs in the cluster
        self.user_jobs: Counter[str] = Counter()
        self.owner: dict[str, tuple[str, str]] = {}  # job -> (team, user)
        self.holding: dict[str, float] = {}  # team -> GPUs held since ``since``
        self.user_holding: dict[str, float] = {}
        self.held_by: dict[str, float] = {}  # job -> GPUs it held at the last decision
        # the jobs that hold their teams' quotas, with the GPUs each counts, and each team's
        # sum: from every job of the team at each decision's start (``_allot``), and the
        # decision's own actions since
        self.holds_quota: dict[str, float] = {}
        self.quota_used: dict[str, float] = defaultdict(float)
        self.since = 0.0

    def observe(self, cluster: Cluster, event: E.Event, cycle: Cycle) -> Decision[None]:
        self.shares = cluster.shares
        self._charge(cluster.now)
        if isinstance(event, E.Arrival):
            user = event.job.user
            team = self.shares.of(user)[0]
            self.owner[event.job.id] = (team, user)
            if not self.jobs[team]:
                self._join(self.used, team, self._team_tickets, self.jobs)
            if not self.user_jobs[user]:
                peers = Counter({u: n for u, n in self.user_jobs.items()
                                 if n and self.shares.of(u)[0] == team})
                self._join(self.user_used, user, self._user_tickets, peers)
            self.jobs[team] += 1
            self.user_jobs[user] += 1
            self.waits_since[event.job.id] = cluster.now
        self._allot(cluster)
        return
        yield

    def forget(self, job_id: str) -> None:
        if job_id in self.holds_quota:
            self.quota_used[self.owner[job_id][0]] -= self.holds_quota.pop(job_id)
        self.waits_since.pop(job_id, None)
        team, user = self.owner.pop(job_id, ("", ""))
        if team:
            self.jobs[team] -= 1
            self.user_jobs[user] -= 1

    def after_decision(self, cluster: Cluster, cycle: Cycle) -> Decision[None]:
        """What each team and user holds until the next event (charged then)."""
        holding: dict[str, float] = defaultdict(float)
        user_holding: dict[str, float] = defaultdict(float)
        held_by = {}
        for jid in cluster.running:
            team, user = self.owner.get(jid, ("", ""))
            gpus = sum(1.0 / len(cluster.gpus[g].jobs) for g in cluster.jobs[jid].gpus)
            holding[team] += gpus
            user_holding[user] += gpus
            held_by[jid] = gpus
        self.holding, self.user_holding = dict(holding), dict(user_holding)
        self.held_by = held_by
        return
        yield

    def _allot(self, cluster: Cluster) -> None:
        """Which jobs hold their teams' quotas, at a decision's start: each team's jobs in the
        team's own order, as many as fit. First those running that cannot checkpoint (they
        cannot give GPUs back), then by their user's pass, priority, less attained service,
        arrival: the team's jobs take turns inside its quota as they would alone."""
        self.holds_quota, self.quota_used = {}, defaultdict(float)
        quotas = self.shares.quotas
        if not quotas:
            return
        now = cluster.now
        jobs = [cluster.jobs[j] for j, (team, _) in self.owner.items()
                if team in quotas and j in cluster.jobs]

        def key(job: Job) -> tuple[bool, float, int, float, int]:
            return (job.spec.checkpoints or job.status is not JobStatus.RUNNING,
                    self._user_pass(self.owner[job.id][1], now), -job.priority,
                    job.attained_at(now), job.seq)

        for job in sorted(jobs, key=key):
            self._take_quota(job.id, self.held_by.get(job.id) or job.num_gpus)

    def order(self, job: Job, now: float) -> float:
        team, user = self.owner.get(job.id, (self.shares.of(job.spec.user)[0], job.spec.user))
        if job.status is not JobStatus.RUNNING and len(self.s.book.home.get(job.id, ())) > 1:
            since = self.waits_since.get(job.id, now)
            if now - since >= self.gang_wait:
                return RESERVED + since
        return (self._pass(self.used, self.holding, team, self._team_tickets, now)
                + USER_WEIGHT * self._user_pass(user, now))

    def _user_pass(self, user: str, now: float) -> float:
        return self._pass(self.user_used, self.user_holding, user, self._user_tickets, now)

    def _pass(self, used: dict[str, float], holding: dict[str, float], who: str,
              tickets: Callable[[str], float], now: float) -> float:
        """``who``'s GPU-seconds received per ticket by ``now``: charged, and held since."""
        return (used.get(who, 0.0) + holding.get(who, 0.0) * (now - self.since)) / tickets(who)

    def tier(self, job: Job) -> int:
        """Across users: the priority class, then whether the job's team, with it running,
        stays within its quota (guaranteed: a borrowing job gives way to it at the next
        round, suspended, never killed)."""
        return 2 * priority_class(job.priority) + self.guaranteed(job)

    @staticmethod
    def rank(job: Job) -> int:
        return job.priority

    def permit(self, job: Job, cluster: Cluster) -> bool:
        """A job that cannot checkpoint runs only within its team's quota, where quotas
        exist: it could not give borrowed GPUs back."""
        return job.spec.checkpoints or not self.shares.quotas or self.guaranteed(job)

    def guaranteed(self, job: Job) -> bool:
        """Does ``job`` hold its team's quota (``_allot``), or would it, placed now, in what
        the holders leave? (A team's other jobs borrow, as other teams' do.)"""
        if job.id in self.holds_quota:
            return True
        if job.status is JobStatus.RUNNING:
            return False
        return self._fits(job.id, job.num_gpus)

    def acted(self, action: A.JobAction) -> None:
        """The decision's own placements take quota at once: the next job the scan looks at
        sees it taken."""
        if isinstance(action, (A.Place, A.Resume)) and self.shares.quotas:
            self._take_quota(action.job_id, len(action.gpus))
        elif isinstance(action, A.Suspend):
            self.waits_since[action.job_id] = self.since
            if action.job_id in self.holds_quota:
                team = self.owner[action.job_id][0]
                self.quota_used[team] -= self.holds_quota.pop(action.job_id)

    def _fits(self, job_id: str, gpus: float) -> bool:
        team = self.owner.get(job_id, ("", ""))[0]
        quota = self.shares.quotas.get(team, 0)
        return bool(quota) and self.quota_used[team] + gpus <= quota + 1e-9

    def _take_quota(self, job_id: str, gpus: float) -> None:
        if job_id not in self.holds_quota and self._fits(job_id, gpus):
            self.holds_quota[job_id] = gpus
            self.quota_used[self.owner[job_id][0]] += gpus

    def _charge(self, now: float) -> None:
        dt = now - self.since
        if dt > 0:
            for team, gpus in self.holding.items():
                self.used[team] = self.used.get(team, 0.0) + gpus * dt
            for user, gpus in self.user_holding.items():
                self.user_used[user] = self.user_used.get(user, 0.0) + gpus * dt
        self.since = now

    @staticmethod
    def _join(used: dict[str, float], who: str, tickets: Callable[[str], float],
              active: Counter[str]) -> None:
        """``who`` comes back: its pass is at least the lowest of those with jobs."""
        passes = [used.get(k, 0.0) / tickets(k) for k, n in active.items() if n and k != who]
        if passes:
            used[who] = max(used.get(who, 0.0), min(passes) * tickets(who))

    def _team_tickets(self, team: str) -> float:
        return self.shares.teams.get(team, 1.0)

    def _user_tickets(self, user: str) -> float:
        return self.shares.of(user)[2]
