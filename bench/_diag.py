import sys, torch, planner, json
sys.argv = ["x"]
from bench.gpu_memory import gpt_stack
from bench.gpu_step import measure
base, batch = gpt_stack()
for budget in (1.0, 0.0):
    torch._dynamo.reset()
    be = planner.backend(planner.PlannerConfig(codegen="inductor", memory_budget=budget, solver="greedy", time_limit=20))
    model = base
    r = measure(torch.compile(model, backend=be), list(model.parameters()), batch, 3)
    tl = be.timelines[0]
    print("BUDGET", budget, r, tl.peak, tl.peak_step, flush=True)
    json.dump(tl.steps, open(f"/tmp/out_tl_{budget}.json", "w"))
