"""export"""
# The families in modules of their own register with hf.FAMILIES on import; importing
# them here makes them known wherever hf is (until the lead's lazy family registry).
from encoderx.export import hf_eurobert, hf_modernbert  # noqa: F401,E402
