"""drrubric"""
