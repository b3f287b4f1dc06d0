"""A multi-agent loop in which one model plays analyst, retriever, writer and triager around the oracle.

Per chain and round:
1. analysis (round 0, and after "restart"): the model plans which operators to replace (a JSON object),
   given the code and the oracle's profile of the reference; `ambition="conservative"` keeps library GEMM
   and convolution and fuses only the memory-bound work around them, `"full"` lets it replace them too;
2. retrieval: patterns from our corpus (`strategies.corpus`) chosen by the task's operators;
3. generation: the prompt this returns; the controller samples it (the writer);
4. evaluation: the oracle's verdict on the candidate (the controller);
5. triage (rounds > 0): the model classifies the last failure and chooses: fix, simplify, or restart.
Helper calls go through `tools.ask`, so their prompts and completions are recorded in the sample record
(`agent_steps`). A plan or decision that cannot be parsed is a failed step with a deterministic fallback
(the profile's memory-bound operators; a decision from the verdict's status), never a crash or a retry:
a round makes at most two helper calls, so the loop ends within its rounds on any output.
"""

from __future__ import annotations

import json
import re
from typing import Any

from strategies.base import Attempt, Strategy, Tools
from strategies.corpus import Pattern, render, retrieve
from strategies.prompts import RULES, SYSTEM, example_block, task_block
from strategies.refine import feedback, previous_code
from tasks.model import Task

AMBITION = {
    "conservative": ("Ambition: conservative. Keep every library GEMM and convolution as it is (call it through "
                     "PyTorch: torch.matmul, F.linear, F.conv2d, or at::mm / at::conv2d in C++). Replace only the "
                     "memory-bound work around them (bias, activations, scaling, residuals, reductions, "
                     "normalisation), fused into as few kernels as possible."),
    "full": ("Ambition: full. Replace as much of the model as you can with your own kernels, library GEMM and "
             "convolution included when you can make them correct, and fuse everything you can."),
}
ACTIONS = ("fix", "simplify", "restart")
FAILURES = ("compile_error", "wrong_result", "crash", "timeout", "rejected", "no_code", "too_slow")
LIBRARY_OPS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_addmm_activation", "convolution", "_convolution",
               "conv1d", "conv2d", "conv3d", "cudnn_convolution", "mkldnn_convolution", "conv_transpose1d",
               "conv_transpose2d", "conv_transpose3d", "scaled_dot_product_attention"}
MAX_ITEMS = 16
# Names in task code (modules, functions) -> the aten operator they become, for tasks without a profile.
CODE_NAMES = {"Linear": "linear", "Conv1d": "convolution", "Conv2d": "convolution", "Conv3d": "convolution",
              "ConvTranspose2d": "convolution", "conv1d": "convolution", "conv2d": "convolution", "conv3d": "convolution",
              "LayerNorm": "layer_norm", "GroupNorm": "group_norm", "BatchNorm2d": "batch_norm", "BatchNorm1d": "batch_norm",
              "RMSNorm": "rms_norm", "Softmax": "softmax", "ReLU": "relu", "GELU": "gelu", "SiLU": "silu", "Dropout": "dropout"}


def bare(op: str) -> str:
    return str(op).split("::")[-1].split(".")[0].strip().lower()


def task_ops(task: Task, profile: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The task's operators: the profile's (with share and bound) or, without one, names read from the code."""
    if profile and profile.get("ops"):
        return [{"op": bare(o["op"]), "share": o.get("share", 0.0), "bound": o.get("bound", "memory"),
                 "library": bool(o.get("library")) or bare(o["op"]) in LIBRARY_OPS} for o in profile["ops"]]
    names: list[str] = []
    for m in re.finditer(r"(?:torch\.nn\.functional|torch|F|nn)\.(\w+)\(", task.code):
        name = m.group(1)
        if name in ("randn", "rand", "zeros", "ones", "empty", "tensor", "Parameter", "Module", "manual_seed"):
            continue
        name = CODE_NAMES.get(name, name.lower())
        if name not in names:
            names.append(name)
    return [{"op": n, "share": 0.0, "bound": "compute" if n in LIBRARY_OPS else "memory", "library": n in LIBRARY_OPS}
            for n in names]


def default_plan(ops: list[dict[str, Any]], ambition: str) -> dict[str, Any]:
    keep = [o["op"] for o in ops if o["library"]] if ambition == "conservative" else []
    replace = [o["op"] for o in ops if o["op"] not in keep]
    return {"replace": replace, "keep": keep, "plan": "fuse the operators to replace into as few kernels as possible"}


def first_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in free text (fenced or not), or None."""
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", text or ""):
        try:
            value, _ = decoder.raw_decode(text, m.start())
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    return None


def parse_plan(text: str, ops: list[dict[str, Any]], ambition: str) -> tuple[dict[str, Any] | None, str]:
    """The analyst's plan, checked against the task's operators; (None, why) when it is unusable."""
    data = first_json_object(text)
    if data is None:
        return None, "no JSON object in the answer"
    replace = data.get("replace")
    if not isinstance(replace, list) or not all(isinstance(x, str) for x in replace):
        return None, "`replace` is not a list of operator names"
    known = {o["op"] for o in ops}
    library = {o["op"] for o in ops if o["library"]}
    chosen = [bare(x) for x in replace if bare(x) in known or not known][:MAX_ITEMS]
    chosen = list(dict.fromkeys(chosen))
    keep = [bare(x) for x in data.get("keep", []) if isinstance(x, str)][:MAX_ITEMS] if isinstance(data.get("keep"), list) else []
    if ambition == "conservative":  # the ambition is ours to set, not the model's
        keep = list(dict.fromkeys(keep + [x for x in chosen if x in library]))
        chosen = [x for x in chosen if x not in library]
    if not chosen:
        return None, "the plan replaces none of the task's operators" + (" (library ones are kept)" if library else "")
    note = data.get("plan") if isinstance(data.get("plan"), str) else ""
    return {"replace": chosen, "keep": [k for k in keep if k not in chosen], "plan": note[:500]}, ""


def parse_decision(text: str) -> tuple[dict[str, str] | None, str]:
    """The triager's decision: {"failure", "action", "reason"}; (None, why) when it is unusable."""
    data = first_json_object(text)
    action = failure = reason = None
    if data is not None:
        action = data.get("action")
        failure, reason = data.get("failure"), data.get("reason")
    else:
        m = re.search(r"^\s*action\s*[:=]\s*\"?([a-z ]+?)\"?\s*$", text or "", re.I | re.M)
        action = m.group(1) if m else None
    if isinstance(action, str):
        action = action.strip().lower().replace("start over", "restart")
    if action not in ACTIONS:
        return None, "no action among fix, simplify, restart"
    return {"failure": failure if failure in FAILURES else "unknown", "action": action,
            "reason": reason[:500] if isinstance(reason, str) else ""}, ""


def default_decision(history: list[Attempt]) -> dict[str, str]:
    """What to do next from the verdicts alone (when the triager's answer is unusable)."""
    last = history[-1]
    failure = {"compile_error": "compile_error", "incorrect": "wrong_result", "runtime_error": "crash",
               "timeout": "timeout", "rejected": "rejected", "no_code": "no_code", "correct": "too_slow"}.get(last.status, "unknown")
    if last.status == "no_code":
        action = "restart"
    elif len(history) >= 2 and history[-2].status == last.status and last.status != "correct":
        action = "simplify"  # the same failure twice: fixing did not work
    elif last.status in ("runtime_error", "timeout"):
        action = "simplify"
    else:
        action = "fix"
    return {"failure": failure, "action": action, "reason": f"from the verdict ({last.status})"}


class Agents(Strategy):
    name = "agents"
    summary = ("one model as analyst, retriever (our pattern corpus), writer and triager around the oracle; "
               "ambition conservative|full")

    def __init__(self, backend: str = "cuda", ambition: str = "conservative", helper_tokens: int = 1024) -> None:
        super().__init__(backend)
        if ambition not in AMBITION:
            raise ValueError(f"ambition must be conservative or full, not '{ambition}'")
        self.ambition = ambition
        self.helper_tokens = int(helper_tokens)
        self.profiles: dict[str, dict[str, Any]] = {}
        self.plans: dict[tuple[str, int], dict[str, Any]] = {}  # (task, chain) -> the plan in force

    def options(self) -> dict[str, Any]:
        return {"backend": self.backend, "ambition": self.ambition, "helper_tokens": self.helper_tokens}

    async def prepare(self, task: Task, tools: Tools) -> None:
        self.profiles[task.id] = await tools.profile(task)

    def shares_prompt(self, round: int) -> bool:
        return False

    # ------------------------------------------------------------ the loop

    async def round_messages(self, task: Task, round: int, history: list[Attempt], tools: Tools) -> list[dict[str, str]]:
        ops = task_ops(task, self.profiles.get(task.id))
        key = (task.id, tools.chain)
        decision = None
        if round > 0 and history:
            decision = await self._triage(task, history, tools)
        if round == 0 or not history or key not in self.plans or (decision and decision["action"] == "restart"):
            self.plans[key] = await self._analyse(task, ops, tools)
        plan = self.plans[key]
        patterns = retrieve(plan["replace"] + plan["keep"], task.code)
        tools.steps.append({"step": "retrieval", "ok": True, "patterns": [p.name for p in patterns]})
        return self.generation(task, plan, patterns, history if round > 0 else [], decision)

    async def _analyse(self, task: Task, ops: list[dict[str, Any]], tools: Tools) -> dict[str, Any]:
        text = await tools.ask(self.analysis_messages(task, ops), step="analysis", max_tokens=self.helper_tokens)
        step = tools.steps[-1] if tools.steps else {}
        plan, why = parse_plan(text, ops, self.ambition)
        if plan is None:
            plan = default_plan(ops, self.ambition)
            step.update(ok=False, error=step.get("error") or why, fallback=plan)
        else:
            step.update(ok=True, parsed=plan)
        return plan

    async def _triage(self, task: Task, history: list[Attempt], tools: Tools) -> dict[str, str]:
        text = await tools.ask(self.triage_messages(task, history), step="triage", max_tokens=self.helper_tokens)
        step = tools.steps[-1] if tools.steps else {}
        decision, why = parse_decision(text)
        if decision is None:
            decision = default_decision(history)
            step.update(ok=False, error=step.get("error") or why, fallback=decision)
        else:
            step.update(ok=True, parsed=decision)
        return decision

    # ------------------------------------------------------------ prompts

    def operator_lines(self, ops: list[dict[str, Any]]) -> str:
        if not ops:
            return "(no operators were found)"
        rows = []
        for o in ops[:MAX_ITEMS]:
            share = f"{100 * o['share']:.0f}% of the time, " if o.get("share") else ""
            rows.append(f"- {o['op']}: {share}{o['bound']}-bound" + (", library GEMM/convolution" if o["library"] else ""))
        return "\n".join(rows)

    def analysis_messages(self, task: Task, ops: list[dict[str, Any]]) -> list[dict[str, str]]:
        user = "\n\n".join([
            f"Task:\n{task_block(task.code)}",
            f"Its operators (from the oracle's profile of the reference on the target device):\n{self.operator_lines(ops)}",
            AMBITION[self.ambition],
            "Plan which operators to replace with custom kernels and which to keep. Answer only with a JSON object:\n"
            '{"replace": ["operator", ...], "keep": ["operator", ...], "plan": "one or two sentences: which kernels, what they fuse"}',
        ])
        return [{"role": "system", "content": "You are the analyst of a team that writes fast, correct GPU kernels."},
                {"role": "user", "content": user}]

    def triage_messages(self, task: Task, history: list[Attempt]) -> list[dict[str, str]]:
        last = history[-1]
        earlier = ", ".join(a.status for a in history[:-1]) or "none"
        user = "\n\n".join([
            f"Task:\n{task_block(task.code)}",
            f"The last attempt:\n{task_block(previous_code(last) or '(an empty answer)')}",
            f"The oracle's verdict: {last.status}\n{(last.message or '')[:3000]}\nEarlier verdicts of this chain: {earlier}",
            "Classify the failure and choose what the writer does next: fix (repair this code), simplify (a plainer "
            "kernel that is obviously correct), or restart (a new plan from scratch). Answer only with a JSON object:\n"
            '{"failure": "' + "|".join(FAILURES) + '", "action": "fix|simplify|restart", "reason": "one sentence"}',
        ])
        return [{"role": "system", "content": "You are the reviewer of a team that writes fast, correct GPU kernels."},
                {"role": "user", "content": user}]

    def generation(self, task: Task, plan: dict[str, Any], patterns: list[Pattern], history: list[Attempt],
                   decision: dict[str, str] | None) -> list[dict[str, str]]:
        plan_text = (f"The plan: replace {', '.join(plan['replace']) or 'nothing'}"
                     + (f"; keep {', '.join(plan['keep'])}" if plan["keep"] else "") + "."
                     + (f" {plan['plan']}" if plan.get("plan") else ""))
        parts = [RULES[self.backend], AMBITION[self.ambition], example_block(self.backend)]
        corpus = render(patterns, self.backend)
        if corpus:
            parts.append(corpus)
        parts += [f"Now the task. Replace the operators of this `Model` with custom kernels:\n{task_block(task.code)}",
                  plan_text]
        if decision and decision["action"] == "restart" and history:
            last = history[-1]
            parts.append(f"An earlier attempt failed ({last.status}: {(last.message or '')[:500]}). Start over with a "
                         "different approach.")
        parts.append("Answer with the complete module defining ModelNew in one ```python block.")
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]
        if not history or decision is None or decision["action"] == "restart":
            return messages
        last = history[-1]
        extra = []
        if decision["action"] == "simplify":
            extra.append("Simplify: write a plainer kernel that is obviously correct: one thread per output element, "
                         "no shared-memory tricks, the same math as the reference step by step; speed comes later.")
        if decision.get("reason"):
            extra.append(f"The reviewer's note: {decision['reason']}")
        ask = feedback(last, "\n\n".join(extra))
        return messages + [{"role": "assistant", "content": task_block(previous_code(last) or "(an empty answer)")},
                           {"role": "user", "content": ask}]

    def messages(self, task: Task, round: int, history: list[Attempt]) -> list[dict[str, str]]:
        """The writer's prompt without the model's help: the default plan, and the verdict's own decision."""
        ops = task_ops(task, self.profiles.get(task.id))
        plan = default_plan(ops, self.ambition)
        decision = default_decision(history) if round > 0 and history else None
        return self.generation(task, plan, retrieve(plan["replace"] + plan["keep"], task.code),
                               history if round > 0 else [], decision)
