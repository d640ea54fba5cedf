"""The Megatron-LM arguments that realise a layer split."""

from __future__ import annotations

from pipette_cp.errors import LayoutError, SpecError
from pipette_cp.specs import Plan


def megatron_split_args(plan: Plan, num_layers: int) -> list[str]:
    """Megatron-LM arguments that realise ``plan.layer_split``.

    - every chunk equal: nothing (Megatron's default split, ``--num-layers`` / pp);
    - each stage's chunks equal and every stage but the first and/or last equal:
      ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``
      (Megatron-Core >= 0.9, ``get_num_layers_to_build`` in
      ``megatron/core/transformer/transformer_block.py``: the given stages keep
      their totals, the others share the rest evenly, every stage's total is cut
      evenly into its vpp chunks);
    - otherwise ``--pipeline-model-parallel-layout`` (Megatron-Core's
      ``PipelineParallelLayerLayout``, ``megatron/core/transformer/
      pipeline_parallel_layer_layout.py``; experimental there): one ``|``-separated
      group per virtual stage in ``chunk * pp + stage`` order, ``E`` the
      embedding, ``t*k`` k transformer layers, ``L`` the loss.  The string fixes
      the virtual stages too, so Megatron refuses it together with
      ``--num-virtual-stages-per-pipeline-rank`` or
      ``--num-layers-per-virtual-pipeline-stage``, and together with the first/last
      stage counts above: the caller gives exactly one of the three forms.

    Raises
    ------
    SpecError
        The split does not sum to ``num_layers``.
    LayoutError
        A virtual stage holds no transformer layer (none of the forms builds one).

    Examples
    --------
    >>> from pipette_cp.specs.layouts import make_plan
    >>> p = make_plan(num_layers=8, dp=1, pp=4, tp=1, micro_batch_size=1)
    >>> megatron_split_args(p, 8)
    []
    >>> megatron_split_args(p.model_copy(update={"layer_split": (1, 2, 2, 3)}), 8)
    ['--decoder-first-pipeline-num-layers', '1', '--decoder-last-pipeline-num-layers', '3']
    >>> megatron_split_args(p.model_copy(update={"layer_split": (2, 1, 3, 2)}), 8)
    ['--pipeline-model-parallel-layout', 'Et*2|t|t*3|t*2L']
    """
    split, pp, vpp = plan.layer_split, plan.pp, plan.vpp
    if sum(split) != num_layers:
        raise SpecError("plan.layer_split", split, f"sums to {sum(split)}, not {num_layers}")
    empty = next((k for k, n in enumerate(split) if n == 0), None)
    if empty is not None:
        stage, chunk = empty % pp, empty // pp
        where = f"stage {stage}" if vpp == 1 else f"chunk {chunk} of stage {stage}"
        raise LayoutError("plan.layer_split", split, f"{where} has no transformer layers")
    if len(set(split)) == 1:
        return []
    chunks = [[split[c * pp + s] for c in range(vpp)] for s in range(pp)]
    totals = [sum(c) for c in chunks]
    if pp > 1 and all(len(set(c)) == 1 for c in chunks):
        middle = set(totals[1:-1])
        if len(middle) <= 1:
            rest = middle.pop() if middle else None
            args: list[str] = []
            if totals[0] != rest:
                args += ["--decoder-first-pipeline-num-layers", str(totals[0])]
            # with pp = 2 the last stage takes what the first leaves
            if totals[-1] != rest and rest is not None:
                args += ["--decoder-last-pipeline-num-layers", str(totals[-1])]
            return args
    groups = [f"t*{n}" if n > 1 else "t" for n in split]
    return ["--pipeline-model-parallel-layout", "E" + "|".join(groups) + "L"]
