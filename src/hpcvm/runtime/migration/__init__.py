"""Live migration of one VM to another host, and the authenticated channel it travels on."""
