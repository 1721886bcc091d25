"""moegate: the whole MoE routing step, one contract, one fused kernel."""

from moegate.capture import RoutingRecorder
from moegate.check import RoutingCheckError, Violation, check_routing
from moegate.config import RouterConfig
from moegate.hf import from_hf_config, moe_layer_types
from moegate.layout import ExpertLayout, ExpertPlacement
from moegate.presets import preset, preset_names
from moegate.router import RouteResult, route

__version__ = "0.1.0"

__all__ = [
    "ExpertLayout",
    "ExpertPlacement",
    "RouteResult",
    "RouterConfig",
    "RoutingCheckError",
    "RoutingRecorder",
    "Violation",
    "__version__",
    "check_routing",
    "from_hf_config",
    "moe_layer_types",
    "preset",
    "preset_names",
    "route",
]
