from billing import calc_total
from billing.invoice import invoice_text

if __name__ == "__main__":
    print(calc_total([(2, 3.5), (1, 10.0)]))
    print(invoice_text("ACME", [(1, 100.0)]))
