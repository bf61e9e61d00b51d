"""The paper's DPO baseline as a plug-in: online DPO on the best and worst report of each scored group."""
