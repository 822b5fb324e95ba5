"""Stage 1: run the user's script under the op walk and write a trace of one steady iteration."""
