"""Accuracy of today's cost models on the 2024-2026 runs of ``modern_runs.csv``.

``python -m pipette_cp.experiments.models.modern_runs [--csv FILE] [--plot FILE.png]``
rebuilds every row of ``instances/calibration/modern_runs.csv`` (MLPerf Training v4.0 ..
v6.0 logs and Megatron-Bridge performance tables, H100 .. GB300) as an instance and a plan
(:func:`.build.row_setup`), or skips it with one line naming the field and the feature
the models lack (:func:`.features.blockers`), predicts it with the
:class:`~pipette_cp.cost.evaluator.evaluate.Evaluator`, and prints on each side of
:func:`~pipette_cp.experiments.models.calibration_split.assign_modern_split`
(:mod:`.report`): throughput (tokens/s/GPU) MAPE and median predicted / measured per GPU
family, precision, dense / MoE, kind and source; the runs that ran but are predicted not
to fit, with their memory bound over the usable memory; the rows representable and the
skip reasons counted; matched precision pairs (one release, model, GPU count and layout
in two precisions: predicted over measured speed-up); logged memory against the
predicted peak; and in how many (source, model, GPU type, GPU count) groups the measured
best configuration is the predicted best.  ``--fit`` first re-fits the Blackwell
family's FP8 and NVFP4 GEMM ceilings on the fit side (:mod:`.fit`) and prints them; the
report uses the committed calibration table either way.

Measured values: ``measured_step_time_s`` (the MLPerf logs' median step, or for the
Megatron-Bridge rows global batch x sequence / (tokens/s/GPU x GPUs)) and
``tokens_per_s_per_gpu``; predicted tokens/s/GPU = measured x measured / predicted step.
Rows marked ``duplicate_of`` (the same runs as another row) are built but left out of
every metric.

Skipped (the first reason is counted; :func:`.metrics.sole_blockers` counts the rows that
one change would make representable): hybrid Mamba models (Nemotron 3),
GPUs missing from the catalogue, CPU offloading, a layout the row does not state,
a setting a knob's rule refuses.  Stated but not costed (listed beside each prediction,
:func:`.features.approximations`): CUDA graphs, FP8 attention, overlapped expert
communication and delayed weight gradients, real (not force-balanced) routing, paged
expert activations.

Assumptions where a row is silent:

- Models: the bundled model the row names (``pipette-cp list models``: gpt3-175b,
  llama-3.1-8b, llama-3-8b, llama-3.1-405b, deepseek-v3, qwen3-235b-a22b, qwen3-30b-a3b)
  with the row's shape columns where given (the MLPerf Llama 3.1 405B vocabulary
  32,256); GPT-OSS 120B from openai/gpt-oss-120b's config.json (sliding windows and
  attention sinks costed); DeepSeek-V3 with its MTP module except "w/o MTP" rows;
  "tokendrop" rows with capacity factor 1.0, padded to capacity; the GPT-3 vocabulary as
  bundled (50,257: the logs print none).
- Frameworks: NeMo for the MLPerf rows (NVIDIA's implementations run NeMo); the
  ``megatron-bridge`` profile (the Megatron-Core of 2025-2026: routing probabilities
  applied in the experts' activation) for Megatron-Bridge.  Transformer Engine's cuDNN fused attention on every GPU; no
  dropout; fused cross-entropy; grouped GEMM; the alltoall dispatcher unless the notes
  say flex; routing force-balanced (load imbalance 1.0) as the tables say; etp 1 for MoE
  models (Megatron-Bridge's MoE recipes); overlapped grad reduce and param gather and the
  distributed optimizer unless the row says otherwise; TP communication overlap with
  tp > 1 unless stated; Megatron-FSDP (``fsdp`` > 0) as ZeRO-3 over dp.
- Megatron-Bridge rows leave sequence parallelism and recompute unsaid: the "recipe at
  HEAD" hint of ``sequence_parallel`` / ``recompute`` is used where the file gives one
  (an older release may have run another recipe); without it, sequence parallel with
  tp > 1 and no recompute.  What Megatron-Bridge's performance scripts
  (``scripts/performance``) set for every workload is applied where the row is silent:
  listed recompute modules run under selective granularity (``_set_recompute_overrides``
  of ``utils/overrides.py``); gradients reduced in bf16 (``grad_reduce_in_fp32 = False``
  in the Llama 3 / 3.1, DeepSeek-V3 and Qwen3 configs); FP8 primary weights
  (``fp8_param_gather``) with the delayed, tensorwise and MXFP8 presets of
  ``src/megatron/bridge/training/mixed_precision.py`` (not blockwise; not with
  Megatron-FSDP, where the knob needs the distributed optimizer).  MLPerf rows keep what
  they state (unstated: off; fp32 gradient reduction).
- Precision: NVFP4 rows (``precision`` fp4) as ``fp4`` (Transformer Engine's NVFP4 recipe
  on every transformer-layer GEMM); ``fp8_recipe``'s first word (``tensorwise`` where the 26.x tables print plain
  "FP8", as the file reads them; delayed where a NeMo 1 log prints none); format as
  stated, else Transformer Engine's default.  Release 25.09 states no precision: FP8
  with tensorwise scaling, and for the parenthesised value of an "a (b)" cell MXFP8 on
  B200 / GB200 and blockwise on H100 (the footnote's other granularity; 25.11 prints
  FP8-CS and MXFP8 for the same layouts within 1 % of these values).
- Layer split: Megatron's even split; the notes' ``PIPELINE_LAYOUT`` where given (v6.0
  DeepSeek-V3); ``asym_pp_embed_loss`` True/True as one layer fewer on the first and last
  chunk (embedding and loss counted as layers).
- Clusters: nominal, NVLink at 0.8 x the datasheet per direction, one NIC per GPU at 0.8
  x the line rate of the row's ``interconnect`` (400 Gb/s ConnectX-7 where blank; 800
  Gb/s ConnectX-8 on B300 / GB300); NVL72 racks as trays of 4 GPUs in NVLink domains of
  ``nvlink_segment_trays`` trays, else the job's trays spread evenly over as few racks as
  hold them (16 of 18 trays per rack for 256 GPUs).  Runs of more than 2,048 GPUs keep
  their micro-batches per pipeline on fewer data-parallel replicas (the step time is the
  same up to the DP ring's (d-1)/d; the distributed optimizer's shard is larger).
- LoRA rows (MLPerf Llama 2 70B LoRA, ``kind`` lora-finetune): the rows state neither
  their adapters nor their sequence length, so the MLPerf reference benchmark's settings
  are used (mlcommons/training ``llama2_70b_lora``, kept by NVIDIA's NeMo implementation:
  rank 16, alpha 32, adapters on the attention's QKV and output projections; GovReport
  sequences of 8,192 tokens), with the base weights frozen as Megatron-Bridge / NeMo PEFT
  freezes them (:mod:`pipette_cp.cost.workload.lora`); not re-read from the rows' logs.
  Their predicted peaks count the frozen base in bf16 (the rows state no FP8 primary
  weights) and, without recomputation at 8,192 tokens and tp = cp = 1 on B300, 187 GiB
  of activations of which 64 GiB are the frozen weights' FP8 column-wise copies kept per
  micro-batch: 1.2-1.4x the usable memory, so they are predicted not to fit (what the
  runs did instead is not stated); their step times are predicted all the same.  The GEMM ceilings are fitted on pretraining rows
  only (:func:`.fit.fit_rows`).
- Memory: ``measured_mem`` (six MLPerf rows, four runs) is read as GiB; it is probably the
  allocator's peak on rank 0, without the CUDA context and NCCL buffers that the
  predicted peak includes.
"""
