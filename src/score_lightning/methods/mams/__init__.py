"""mams"""
