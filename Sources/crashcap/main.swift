print("crashcap")
