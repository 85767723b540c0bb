"""What `clusterrun check` learns about torch on a host, run by the probe (probe.py) in a child process so
that a torch that hangs (CUDA init) or crashes (ABI mismatch) still leaves the other facts; torchvision
gets its own line because importing it can fail in ways torch does not. Prints two JSON lines."""

import json, sys
out = {}
try:
    import torch
except BaseException as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
    print(json.dumps(out)); sys.exit(0)
out["version"] = torch.__version__
out["cuda_build"] = getattr(torch.version, "cuda", None)
try:
    out["cuda"] = bool(torch.cuda.is_available())
    out["devices"] = torch.cuda.device_count() if out["cuda"] else 0
    out["device_names"] = [torch.cuda.get_device_name(i) for i in range(min(out["devices"], 8))]
except Exception as exc:
    out["cuda"], out["devices"], out["cuda_error"] = False, 0, "%s: %s" % (type(exc).__name__, exc)
try:
    import torch.distributed as dist
    out["dist"] = bool(dist.is_available())
    out["gloo"] = bool(out["dist"] and dist.is_gloo_available())
    out["nccl"] = bool(out["dist"] and dist.is_nccl_available())
except Exception as exc:
    out["dist"], out["dist_error"] = False, "%s: %s" % (type(exc).__name__, exc)
if out.get("nccl") and out.get("cuda"):
    try:
        v = torch.cuda.nccl.version()
        out["nccl_version"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:
        pass
print(json.dumps(out)); sys.stdout.flush()
vision = {}
try:
    import torchvision
    vision["torchvision"] = torchvision.__version__
except ImportError as exc:
    if getattr(exc, "name", None) != "torchvision":
        vision["torchvision_error"] = "%s: %s" % (type(exc).__name__, exc)
except Exception as exc:
    vision["torchvision_error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(vision))
