"""The control wire shared by client and server: each operation's arguments declared once (args), the RPC channel, data-plane tickets, the connection watch."""
