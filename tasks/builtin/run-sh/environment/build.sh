printf 'sh build 903\n' > out.txt
