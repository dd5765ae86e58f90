"""Every form a password can take in a results store URL, for the tests that make sure none is ever shown
(tests/unit/plan/test_urls.py, tests/workflow/test_password_probe.py): in the user information with each
character that ends or splits a URL's parts unescaped, and as each query parameter that carries one."""

# The password's two halves: neither may appear in any output, whatever the character between them.
SECRET_PARTS = ("Qx7k", "Zr9m")
FORMS = [
    *(f"postgresql://user:Qx7k{between}Zr9m@db.example.org:5432/history" for between in "/ '\"@%:?#&"),
    "postgresql://user:Qx7k%40Zr9m@db.example.org/history",
    "postgresql://user:Qx7k Zr9m@db.example.org:notaport/history",
    "postgresql://user@db.example.org/history?password=Qx7kZr9m",
    "postgresql://user@db.example.org/history?sslmode=require&sslpassword=Qx7k Zr9m",
    "postgresql://user@db.example.org/history?PASSWORD=Qx7k&Zr9m",
    "postgresql://user@db.example.org/history?password='Qx7k Zr9m'&sslmode=require",
    "sqlite://user:Qx7k/Zr9m@/results/history.db",
]


def shown_anywhere(texts) -> list[str]:
    """The texts that show a part of the password."""
    return [text for text in texts if any(part in text for part in SECRET_PARTS)]
