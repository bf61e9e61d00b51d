"""arco"""
