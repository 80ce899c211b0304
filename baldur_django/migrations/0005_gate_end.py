from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("baldur_django", "0004_audit_forget")]

    operations = [
        migrations.CreateModel(
            name="GateEnd",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("key", models.CharField(max_length=80, unique=True)),
                ("name", models.TextField()),
                ("until", models.FloatField()),
            ],
            options={"verbose_name": "Retry-After gate", "default_permissions": ()},
        ),
    ]
