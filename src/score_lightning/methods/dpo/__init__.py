"""The paper's DPO baseline as a plug-in: online DPO on the best and worst report of each scored group.

``loss.py`` holds the pure maths (checked against TRL); importing ``plugin.py`` (``objective.py``) registers ``solver.objective=dpo``.
"""
